"""validate(): parallelism, hardware rules as data, secrets, flags against the pinned catalogue."""

from __future__ import annotations

import pytest

from toolkit.adapters.sglang_catalogue import available_versions, load_catalogue
from toolkit.core.profile import validate
from toolkit.core.profile.rules import CHECKS, FIELD_RULES, RULES, field_rule_hits, matching_rules


def _problems(store, name: str, version: str | None = None):
    r = store.resolve(name)
    return validate(r, load_catalogue(version or r.engine.sglang_version))


def _child(base_yaml: str, body: str) -> dict[str, str]:
    return {"base": base_yaml, "c": "schema_version: 1\nname: c\nextends: base\n" + body}


def test_the_base_fixture_is_clean(write_profiles, base_yaml) -> None:
    store = write_profiles({"base": base_yaml})
    assert [p for p in _problems(store, "base") if p.severity != "info"] == []


@pytest.mark.parametrize(
    ("body", "rule_id", "severity"),
    [
        ("server:\n  allreduce_fusion: true\n", "sm120-allreduce-fusion", "error"),
        ("server:\n  cuda_graph: true\n", "sm120-nsa-cuda-graph", "warning"),
        ("server:\n  tp_size: 4\n  pp_size: 2\n  radix_cache: true\n", "pp-radix-nsa", "warning"),
        ("server:\n  nsa_decode_backend: null\n", "sm120-nsa-default-backends", "warning"),
        ("server:\n  prefill_attention_backend: flashinfer\n", "nsa-phase-backend-leaves-nsa", "warning"),
        ("server:\n  moe_runner_backend: flashinfer_cutlass\n  ep_size: 4\n", "flashinfer-cutlass-ep", "error"),
        (
            "model:\n  quantization: fp8\nserver:\n  moe_runner_backend: flashinfer_cutlass\n",
            "flashinfer-cutlass-quantization",
            "error",
        ),
        ("engine:\n  sglang_version: 0.5.23\nserver:\n  nsa_decode_backend: trtllm\n", "sm120-dsa-trtllm-backend",
         "warning"),
        ("engine:\n  sglang_version: 0.5.14\nserver:\n  cuda_graph: true\n", "sm120-dsa-full-decode-graph",
         "warning"),
        ("target:\n  compute_capability: SM90\nserver:\n  allreduce_fusion: true\n", "pcie-allreduce-fusion",
         "warning"),
        ("env:\n  SGLANG_SKIP_P2P_CHECK: '1'\nserver:\n  extra_args: [--enable-p2p-check]\n",
         "no-p2p-skip-p2p-check", "error"),
    ],
)
def test_each_rule_fires_where_its_condition_holds(write_profiles, base_yaml, body, rule_id, severity) -> None:
    store = write_profiles(_child(base_yaml, body))
    hits = [p for p in _problems(store, "c") if p.rule_id == rule_id]
    assert len(hits) == 1 and hits[0].severity == severity
    assert hits[0].file.endswith("c.yaml") and hits[0].line is not None


def test_rules_are_data_with_sources() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    for rule in RULES:
        assert rule.severity in {"error", "warning", "info"} and rule.source and rule.fix and rule.when


def test_rules_cover_every_rule() -> None:
    """Each rule has a case in test_each_rule_fires_where_its_condition_holds (a new rule needs one)."""
    marks = test_each_rule_fires_where_its_condition_holds.pytestmark  # type: ignore[attr-defined]
    tried = {case[1] for mark in marks if mark.name == "parametrize" for case in mark.args[1]}
    missing = {r.id for r in RULES} - tried - {
        "no-p2p-allreduce-bound", "public-bind-without-api-key", "allow-unauthenticated-needs-why",
        "public-bind-acknowledged", "no-p2p-custom-allreduce",
        # covered by their own tests below and in test_profile_broken_corpus.py
    }
    assert missing == set()


@pytest.mark.parametrize(
    ("version", "fires"), [("0.5.9", False), ("0.5.16", False), ("0.5.17", True), ("0.5.23", True)]
)
def test_a_rule_applies_to_the_releases_it_names(write_profiles, base_yaml, version, fires) -> None:
    store = write_profiles(_child(base_yaml, f"engine:\n  sglang_version: {version}\n"))
    hit = [r.id for r in matching_rules(store.resolve("c"))]
    assert ("sm120-dsa-trtllm-backend" in hit) is fires


def test_release_bounds() -> None:
    from toolkit.core.profile.rules import release_in

    assert release_in("0.5.15.post1", ">=0.5.15,<0.5.16") and not release_in("0.5.16", ">=0.5.15,<0.5.16")
    assert release_in("0.5.10", "<0.5.9.post1") is False and release_in(None, ">=9.9.9")
    with pytest.raises(ValueError):
        release_in("0.5.9", "~0.5")


def test_rule_does_not_fire_off_sm120(write_profiles, base_yaml) -> None:
    store = write_profiles(
        _child(base_yaml, "target:\n  compute_capability: SM90\nserver:\n  allreduce_fusion: true\n")
    )
    assert not [r for r in matching_rules(store.resolve("c")) if r.id == "sm120-allreduce-fusion"]


def test_dp_attention_does_not_multiply_gpus(write_profiles, base_yaml) -> None:
    store = write_profiles(_child(base_yaml, "server:\n  dp_size: 8\n  enable_dp_attention: true\n"))
    assert [p for p in _problems(store, "c") if p.severity == "error"] == []
    store = write_profiles(_child(base_yaml, "server:\n  dp_size: 2\n"))
    errors = [p for p in _problems(store, "c") if p.severity == "error"]
    assert len(errors) == 1 and "= 16 GPUs" in errors[0].message


def test_fewer_gpus_than_the_target_is_a_warning(write_profiles, base_yaml) -> None:
    store = write_profiles(_child(base_yaml, "server:\n  tp_size: 4\n"))
    (p,) = [p for p in _problems(store, "c") if p.field == "server.tp_size" and p.severity != "info"]
    assert p.severity == "warning" and "4 would sit idle" in p.message


def test_required_facts_name_the_chain(write_profiles) -> None:
    store = write_profiles({"bare": "schema_version: 1\nname: bare\n"})
    fields = sorted(p.field for p in _problems(store, "bare") if p.severity == "error")
    assert fields == ["engine.sglang_version", "model.repo_id", "target.compute_capability", "target.gpu_count"]


@pytest.mark.parametrize("ref", ["env:SGLANG_API_KEY", "vault:sglang_api_key", "file:/etc/sglang/key"])
def test_secret_references_pass(write_profiles, base_yaml, ref) -> None:
    store = write_profiles(_child(base_yaml, f"server:\n  api_key_secret: {ref}\n"))
    assert not [p for p in _problems(store, "c") if p.field == "server.api_key_secret"]


@pytest.mark.parametrize("body", ["server:\n  extra_args: [--api-key, abc]\n", "env:\n  HF_TOKEN: hf_x\n"])
def test_secrets_in_args_or_env_are_errors(write_profiles, base_yaml, body) -> None:
    store = write_profiles(_child(base_yaml, body))
    assert len([p for p in _problems(store, "c") if p.severity == "error"]) == 1


def test_deprecated_flag_in_extra_args_is_a_warning_naming_the_new_flag(write_profiles, base_yaml) -> None:
    # The typed knobs render 0.5.15's own names (no warning); a deprecated flag written by hand still warns.
    assert "0.5.15" in available_versions()
    body = "engine:\n  sglang_version: 0.5.15\nserver:\n  extra_args: [--mamba-scheduler-strategy, no_buffer]\n"
    store = write_profiles(_child(base_yaml, body))
    warnings = {p.message: p.fix for p in _problems(store, "c") if p.severity == "warning"}
    assert list(warnings) == ["--mamba-scheduler-strategy is deprecated in SGLang 0.5.15"]
    assert warnings["--mamba-scheduler-strategy is deprecated in SGLang 0.5.15"].startswith(
        "use --mamba-radix-cache-strategy")
    assert not [p for p in _problems(store, "c") if p.severity == "error"]


def test_a_removed_flag_in_extra_args_is_an_error_naming_its_successor(write_profiles, base_yaml) -> None:
    body = "engine:\n  sglang_version: 0.5.23\nserver:\n  extra_args: [--nsa-prefill-backend, fa3]\n"
    store = write_profiles(_child(base_yaml, body))
    (p,) = [p for p in _problems(store, "c") if p.severity == "error"]
    assert p.message == "SGLang 0.5.23 has no flag --nsa-prefill-backend"
    # Its successor belongs to a typed knob: the fix names the knob, not a flag extra_args may not set.
    assert p.fix.startswith("set server.nsa_prefill_backend: it renders --dsa-prefill-backend on SGLang 0.5.23 "
                            "(SGLang 0.5.13 renamed NSA to DSA")


def test_flag_missing_in_the_pinned_version_is_an_error(write_profiles, base_yaml) -> None:
    # --dsa-decode-backend exists from 0.5.15 on; pinned to 0.5.9 it is unknown, with a suggestion.
    store = write_profiles(_child(base_yaml, "server:\n  extra_args: [--dsa-decode-backend, trtllm]\n"))
    (p,) = [p for p in _problems(store, "c") if p.severity == "error"]
    assert p.message == "SGLang 0.5.9 has no flag --dsa-decode-backend"
    assert "--nsa-decode-backend" in p.fix and p.field == "server.extra_args.0" and p.line == 5


@pytest.mark.parametrize("args", ["['--schedule-policy=fcsf']", "[--schedule-policy, fcsf]"])
def test_value_outside_choices_in_extra_args(write_profiles, base_yaml, args) -> None:
    store = write_profiles(_child(base_yaml, f"server:\n  extra_args: {args}\n"))
    (p,) = [p for p in _problems(store, "c") if p.severity == "error"]
    assert "'fcsf' is not a value" in p.message and "fcfs" in p.fix and p.field == "server.extra_args.0"


def test_no_catalogue_for_the_version_is_an_error(write_profiles, base_yaml) -> None:
    store = write_profiles(_child(base_yaml, "engine:\n  sglang_version: 0.1.0\n"))
    (p,) = [p for p in _problems(store, "c") if p.severity == "error"]
    assert p.field == "engine.sglang_version" and "toolkit profile catalogue --sglang-version 0.1.0" in p.fix


def test_shipped_profiles_have_no_errors_and_a_why_for_every_set_server_knob(shipped) -> None:
    from toolkit.core.profile.diff import why_for

    assert set(shipped.names()) >= {"glm5-baseline", "glm5-tp8", "glm5-tp4-pp2", "glm5-ep8"}
    for name in shipped.names():
        r = shipped.resolve(name)
        assert [p.render() for p in validate(r, load_catalogue(r.engine.sglang_version)) if p.severity == "error"] == []
        own = r.source.data.get("server", {})
        missing = [k for k in own if why_for(r, f"server.{k}") is None and k not in ("host",)]
        assert missing == [], f"{name}: server knobs without a why: {missing}"


def test_why_for_an_unknown_knob_is_a_warning(write_profiles, base_yaml) -> None:
    store = write_profiles(
        _child(base_yaml, "why:\n  server.max_runing_requests: {reason: typo}\n  server: {reason: ok}\n")
    )
    (p,) = [p for p in _problems(store, "c") if p.field and p.field.startswith("why.")]
    assert p.severity == "warning" and "'server.max_running_requests'" in p.fix and p.line == 5


@pytest.mark.parametrize(
    ("body", "rule_id", "field"),
    [
        ('server:\n  host: "10.0.0.1 --api-key x"\n', "host-address", "server.host"),
        ("server:\n  dist_init_addr: 10.0.0.1\n", "dist-init-addr", "server.dist_init_addr"),
        ("engine:\n  venv_path: venv\n", "absolute-path", "engine.venv_path"),
        ("model:\n  local_path: /m/../x\n", "absolute-path", "model.local_path"),
        ("bench:\n  tokenizer: ../tok\n", "tokenizer-path", "bench.tokenizer"),
        ('env:\n  NCCL_DEBUG: "a\\tb"\n', "control-characters", "env.NCCL_DEBUG"),
        ('engine:\n  patches:\n    - {name: p, target: a/b.py, target_sha256: "' + "0" * 64 + '", '
         'patch: "profiles/patches/p\\n.patch", reason: r, link: l}\n', "control-characters",
         "engine.patches.0.patch"),
    ],
)
def test_each_field_rule_fires_on_its_field(write_profiles, base_yaml, body, rule_id, field) -> None:
    store = write_profiles(_child(base_yaml, body))
    hits = [p for p in _problems(store, "c") if p.rule_id == rule_id]
    assert [(p.field, p.severity) for p in hits] == [(field, "error")]
    assert hits[0].file.endswith("c.yaml") and hits[0].line is not None and hits[0].fix


def test_field_rules_are_data_with_known_checks() -> None:
    ids = [r.id for r in FIELD_RULES]
    assert len(ids) == len(set(ids))
    for rule in FIELD_RULES:
        assert rule.check in CHECKS and rule.fix and rule.source and "{detail}" in rule.message


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "0.0.0.0", "::", "10.1.2.3", "gpu-01.lab.example"])
def test_addresses_and_names_pass_the_host_rule(write_profiles, base_yaml, host) -> None:
    store = write_profiles(_child(base_yaml, f"server:\n  host: '{host}'\n  api_key_secret: env:K\n"))
    assert not field_rule_hits(store.resolve("c"))


@pytest.mark.parametrize("host", ["300.1.2.3", "-gpu", "gpu_01", "a b", "http://10.0.0.1", ""])
def test_what_is_no_address_fails_the_host_rule(write_profiles, base_yaml, host) -> None:
    store = write_profiles(_child(base_yaml, f"server:\n  host: '{host}'\n"))
    (hit,) = field_rule_hits(store.resolve("c"))
    assert hit[0].id == "host-address"


def test_prose_may_hold_newlines_but_rendered_strings_may_not(write_profiles, base_yaml) -> None:
    store = write_profiles(_child(base_yaml, "description: |\n  two\n  lines\nwhy:\n  server: {reason: \"a\\nb\"}\n"))
    assert not [p for p in _problems(store, "c") if p.rule_id == "control-characters"]


def test_an_open_bind_that_says_why_is_a_warning(write_profiles, base_yaml) -> None:
    body = ("server:\n  host: 0.0.0.0\n  allow_unauthenticated: true\n"
            "why:\n  server.allow_unauthenticated: {reason: private lab network behind an authenticating proxy}\n")
    store = write_profiles(_child(base_yaml, body))
    problems = _problems(store, "c")
    assert not [p for p in problems if p.severity == "error"]
    (warn,) = [p for p in problems if p.rule_id == "public-bind-acknowledged"]
    assert warn.severity == "warning" and "WITHOUT an API key" in warn.message and warn.line == 6


def test_an_open_bind_with_a_key_needs_no_acknowledgement(write_profiles, base_yaml) -> None:
    store = write_profiles(_child(base_yaml, "server:\n  host: 0.0.0.0\n  api_key_secret: env:SGLANG_API_KEY\n"))
    assert not [p for p in _problems(store, "c") if p.rule_id and "bind" in p.rule_id]


def test_the_acknowledgement_does_not_change_the_spec_hash(write_profiles, base_yaml) -> None:
    from toolkit.core.profile import spec_hash

    why = "why:\n  server.allow_unauthenticated: {reason: r}\n"
    a = write_profiles(_child(base_yaml, "server:\n  host: 0.0.0.0\n  api_key_secret: env:K\n")).resolve("c")
    b = write_profiles(_child(base_yaml, "server:\n  host: 0.0.0.0\n  api_key_secret: env:K\n"
                              "  allow_unauthenticated: true\n" + why)).resolve("c")
    assert spec_hash(a) == spec_hash(b)


@pytest.mark.parametrize("version", ["0.5.9", "0.5.15"])
def test_every_name_of_every_typed_flag_is_refused_in_extra_args(write_profiles, base_yaml, version) -> None:
    """Derived from the catalogue, not a list: for each flag a typed field renders, every name SGLang gives its
    destination (aliases, and the flag a deprecated one is replaced by), written plain, with `=value` and cut to
    its shortest unique prefix, is refused as an override of that field (or as a secret)."""
    from toolkit.core.profile.argv import read_option
    from toolkit.core.profile.flags import typed_destinations

    catalogue = load_catalogue(version)
    owned = typed_destinations(catalogue)
    options = [n for f in catalogue.flags for n in f.names]
    names = sorted({n for f in catalogue.flags if f.dest in owned for n in f.names})
    assert {"--tensor-parallel-size", "--tp-size", "--ep", "--model", "--host", "--api-key"} <= set(names)
    for name in names:
        short = next(name[:k] for k in range(3, len(name) + 1)
                     if read_option(0, name[:k], options).option == name or name[:k] == name)
        for args in ([name, "4"], [f"{name}=4"], [short, "4"]):
            store = write_profiles(_child(base_yaml, f"engine:\n  sglang_version: {version}\n"
                                          f"server:\n  extra_args: {args!r}\n"))
            errors = [p for p in _problems(store, "c") if p.field == "server.extra_args.0"]
            assert len(errors) == 1, (args, errors)
            assert "would override" in errors[0].message or "carries a secret" in errors[0].message, (args, errors)


def test_a_deprecated_typed_flags_replacement_is_owned_too(write_profiles, base_yaml) -> None:
    """0.5.15 renamed --nsa-decode-backend to --dsa-decode-backend (same dest) and replaces
    --enable-flashinfer-allreduce-fusion by --flashinfer-allreduce-fusion-backend (another dest)."""
    for token in ("--dsa-decode-backend=trtllm", "--flashinfer-allreduce-fusion-backend=auto",
                  "--cuda-graph-backend-decode=disabled"):
        store = write_profiles(_child(base_yaml, f"engine:\n  sglang_version: 0.5.15\n"
                                      f"server:\n  extra_args: ['{token}']\n"))
        (p,) = [p for p in _problems(store, "c") if p.severity == "error"]
        assert "would override server." in p.message, (token, p)


def test_a_flag_owned_by_no_typed_knob_passes_in_every_spelling_sglang_reads(write_profiles, base_yaml) -> None:
    store = write_profiles(_child(base_yaml, "server:\n  extra_args: [--max-total-tokens, '4096', "
                                  "'--schedule-policy=lpm', --enable-mixed-chunk, --chunked-prefill-size]\n"))
    problems = [p for p in _problems(store, "c") if p.field and p.field.startswith("server.extra_args")]
    assert len(problems) == 1 and "would override server.chunked_prefill_size" in problems[0].message


@pytest.mark.parametrize(
    ("body", "renders"),
    [
        ("server:\n  tp_size: 2\n", True),  # SGLang would build the custom allreduce on P2P it never tested
        ("target:\n  interconnect: nvlink\nserver:\n  tp_size: 4\n", True),
        ("server:\n  tp_size: 8\n", False),  # more than two PCIe GPUs: SGLang keeps it off itself
        ("server:\n  tp_size: 2\n  extra_args: [--enable-p2p-check]\n", False),  # SGLang tests P2P
        ("target:\n  p2p: true\nserver:\n  tp_size: 2\n", False),
    ],
)
def test_a_no_p2p_target_renders_the_custom_allreduce_off(write_profiles, base_yaml, body, renders) -> None:
    from toolkit.core.profile.render import render_launch_argv

    resolved = write_profiles(_child(base_yaml, body)).resolve("c")
    assert ("--disable-custom-all-reduce" in render_launch_argv(resolved)) is renders
    assert "no-p2p-custom-allreduce" not in [r.id for r in matching_rules(resolved)]


def test_no_p2p_on_a_release_without_the_flag_is_refused(write_profiles, base_yaml) -> None:
    import dataclasses

    from toolkit.core.profile.catalogue import Catalogue
    from toolkit.core.profile.render import render_launch_argv

    resolved = write_profiles(_child(base_yaml, "server:\n  tp_size: 2\n")).resolve("c")
    assert resolved.catalogue is not None
    flags = [f for f in resolved.catalogue.flags if "--disable-custom-all-reduce" not in f.names]
    without = dataclasses.replace(resolved, catalogue=Catalogue(resolved.catalogue.sglang_version, flags))
    assert "no-p2p-custom-allreduce" in [r.id for r in matching_rules(without)]
    assert "--disable-custom-all-reduce" not in render_launch_argv(without)
