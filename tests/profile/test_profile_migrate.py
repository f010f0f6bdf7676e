"""Rendering that follows the pinned release (flagmap), and `toolkit profile migrate` between releases."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from toolkit.adapters.profile_store import ProfileStore
from toolkit.adapters.sglang_catalogue import available_versions, load_catalogue
from toolkit.core.profile import validate
from toolkit.core.profile.catalogue import Catalogue, FlagInfo
from toolkit.core.profile.flagmap import RENAMES, SERVER_KNOBS, knob_flags, parse_replacement
from toolkit.core.profile.migrate import PatchTarget, plan_migration
from toolkit.core.profile.render import render_launch_argv

REPO = Path(__file__).resolve().parents[2]

# Every knob set, as the GLM profiles and their neighbours set them.
EVERY_KNOB = """\
server:
  tp_size: 8
  dp_size: 2
  enable_dp_attention: true
  nsa_prefill_backend: flashmla_sparse
  nsa_decode_backend: trtllm
  moe_runner_backend: flashinfer_cutlass
  flashinfer_autotune: false
  allreduce_fusion: true
  cuda_graph: false
  cuda_graph_max_bs: 256
  radix_cache: false
"""


def _child(base_yaml: str, body: str) -> dict[str, str]:
    return {"base": base_yaml, "c": "schema_version: 1\nname: c\nextends: base\n" + body}


@pytest.mark.parametrize(
    ("text", "takes_value", "spelling"),
    [
        ("--dsa-decode-backend", True, (("--dsa-decode-backend", "{value}"),)),
        ("--incremental-streaming-output", False, (("--incremental-streaming-output", None),)),
        ("--cuda-graph-backend-prefill=breakable", False, (("--cuda-graph-backend-prefill", "breakable"),)),
        ("--cuda-graph-backend-{decode,prefill}=disabled", False,
         (("--cuda-graph-backend-decode", "disabled"), ("--cuda-graph-backend-prefill", "disabled"))),
        ("--attn-dp-size <dp-size>", False, None),  # a placeholder: RENAMES says what it means
        ("--x=a b", False, None),
    ],
)
def test_sglangs_new_flag_texts(text: str, takes_value: bool, spelling) -> None:
    assert parse_replacement(text, takes_value) == spelling


def test_each_rename_is_what_a_shipped_release_says() -> None:
    """Every RENAMES entry matches a release that still carries the old flag deprecated (its `new_flag`), so the
    table only says what SGLang said, for the releases that no longer say it."""
    said: dict[str, set[str]] = {}
    for version in available_versions():
        for flag in load_catalogue(version).flags:
            if flag.deprecated and flag.replacement:
                said.setdefault(flag.names[0], set()).add(flag.replacement)
    for rename in RENAMES:
        assert rename.old in said, rename.old
        new_flags = {f for f, _ in rename.new}
        assert any(
            {f for f, _ in parse_replacement(text, True) or ()} == new_flags or text.split(" ")[0] in new_flags
            for text in said[rename.old]
        ), (rename.old, said[rename.old])
        assert rename.source


@pytest.mark.parametrize("version", ["0.5.9", "0.5.13", "0.5.14", "0.5.19", "0.5.20", "0.5.23"])
def test_the_render_has_only_flags_the_release_takes_live(write_profiles, base_yaml, version: str) -> None:
    body = f"engine:\n  sglang_version: {version}\n" + EVERY_KNOB.replace("server:\n", "", 1).join(["server:\n", ""])
    store = write_profiles(_child(base_yaml, body))
    resolved = store.resolve("c")
    cat = load_catalogue(version)
    argv = render_launch_argv(resolved)
    flags = [a for a in argv[3:] if a.startswith("--")]
    assert [f for f in flags if cat.get(f) is None] == []  # nothing the release removed
    assert [f for f in flags if not cat.live(f)] == []  # nothing it deprecates: each knob has a live spelling
    want = {
        "0.5.9": ["--nsa-decode-backend", "--disable-cuda-graph", "--cuda-graph-max-bs", "--dp-size"],
        "0.5.13": ["--dsa-decode-backend", "--disable-cuda-graph", "--enable-flashinfer-allreduce-fusion"],
        "0.5.14": ["--dsa-decode-backend", "--cuda-graph-backend-decode", "--cuda-graph-max-bs-decode",
                   "--flashinfer-allreduce-fusion-backend"],
        "0.5.19": ["--dsa-prefill-backend", "--cuda-graph-backend-prefill", "--enable-dp-attention"],
        "0.5.20": ["--dsa-prefill-backend", "--cuda-graph-max-bs-decode", "--enable-dp-attention", "--dp-size"],
        "0.5.23": ["--attn-dp-size", "--dsa-decode-backend", "--cuda-graph-backend-decode"],
    }[version]
    assert set(want) <= set(flags), (version, flags)
    if version == "0.5.23":  # --attn-dp-size N replaces --dp-size N --enable-dp-attention
        assert "--dp-size" not in flags and "--enable-dp-attention" not in flags
        assert argv[argv.index("--attn-dp-size") + 1] == "2"
    assert [p for p in validate(resolved, cat) if p.severity == "error" and "flag" in p.message] == []


def test_a_knob_its_release_lacks_is_refused_and_never_rendered(write_profiles, base_yaml) -> None:
    store = write_profiles(_child(base_yaml, "engine:\n  sglang_version: 0.5.23\n"))
    real = load_catalogue("0.5.23")
    bare = Catalogue("0.5.23", [f for f in real.flags if "decode-backend" not in " ".join(f.names)] or [])
    resolved = dataclasses.replace(store.resolve("c"), catalogue=bare)
    (problem,) = [p for p in validate(resolved, bare) if "no counterpart" in p.message]
    assert problem.severity == "error" and problem.field == "server.nsa_decode_backend"
    assert "no counterpart in SGLang 0.5.23" in problem.message
    assert "--nsa-decode-backend / --dsa-decode-backend" in problem.message
    with pytest.raises(ValueError, match="no counterpart"):
        render_launch_argv(resolved)


def test_every_knob_has_a_spelling_on_every_shipped_release() -> None:
    for version in available_versions():
        missing = [k for k, c in knob_flags(load_catalogue(version)).items() if c.spelling is None]
        assert missing == [], (version, missing)
    assert len(SERVER_KNOBS) == len({k.field for k in SERVER_KNOBS})


# ---- migrate ----------------------------------------------------------------------------------


def _plan(store: ProfileStore, name: str, version: str, **kw):
    resolved = store.resolve(name)
    return plan_migration(store.source(name), resolved, resolved.catalogue, load_catalogue(version), **kw)


def test_migrating_glm5_tp8_to_the_newest_release(shipped) -> None:
    mig = _plan(shipped, "glm5-tp8", "0.5.23", patch_targets={})
    assert mig.refusals == []
    moved = {c.path: (c.old, c.new) for c in mig.changes}
    assert moved["server.nsa_decode_backend"] == ("--nsa-decode-backend trtllm", "--dsa-decode-backend trtllm")
    assert moved["server.cuda_graph"] == (
        "--disable-cuda-graph", "--cuda-graph-backend-decode disabled --cuda-graph-backend-prefill disabled"
    )
    assert moved["engine.patches.0"] == ("sm120-cutlass-moe-autotune", "(dropped)")
    assert moved["engine.sglang_version"] == ("0.5.9", "0.5.23")
    why = next(c for c in mig.changes if c.path == "server.nsa_decode_backend")
    assert "pull/38375" in why.source and why.why == "SGLang 0.5.13 renamed NSA to DSA"
    old, new = shipped.source("glm5-tp8").text.splitlines(), mig.text.splitlines()
    # Only the engine block changes: every comment, the why texts and the results block stay byte for byte.
    assert [line for line in old if line.lstrip().startswith("#") and "0.5.13" not in line and
            "still had it" not in line] == [line for line in new if line.lstrip().startswith("#")]
    assert old[old.index("server:"):] == new[new.index("server:"):]
    assert "  sglang_version: 0.5.23" in new and "  patches: []" in new


def test_migrating_keeps_a_patch_whose_file_is_unchanged_and_refuses_one_whose_file_changed(shipped) -> None:
    patch = shipped.resolve("glm5-tp8").engine.patches[0]
    same = _plan(shipped, "glm5-tp8", "0.5.10", patch_targets={0: PatchTarget(True, patch.target_sha256)})
    assert same.refusals == [] and not any(c.path.startswith("engine.patches") for c in same.changes)
    assert "engine:\n  sglang_version: 0.5.10\n" in same.text and "target_sha256" in same.text
    changed = _plan(shipped, "glm5-tp8", "0.5.10", patch_targets={0: PatchTarget(True, "0" * 64)})
    (refusal,) = changed.refusals
    assert changed.text is None and refusal.field == "engine.patches.0"
    assert "SGLang 0.5.10 has sha256 0000" in refusal.message and "rebase the patch" in refusal.fix


@pytest.mark.parametrize(
    ("body", "version", "field", "words"),
    [
        ("server:\n  kv_cache_dtype: fp4_e2m1\n", "0.5.21", "server.kv_cache_dtype", "no longer accepts 'fp4_e2m1'"),
        ("server:\n  extra_args: [--enable-double-sparsity]\n", "0.5.11", "server.extra_args.0",
         "SGLang 0.5.11 has no --enable-double-sparsity, and no successor is known"),
    ],
)
def test_what_has_no_counterpart_is_refused_with_the_reason(write_profiles, base_yaml, body, version, field,
                                                              words) -> None:
    store = write_profiles(_child(base_yaml, body))
    mig = _plan(store, "c", version, patch_targets={})
    assert mig.text is None
    (refusal,) = [r for r in mig.refusals if r.field == field]
    assert words in refusal.message and refusal.fix


def test_extra_args_flags_move_with_their_rename_known_to_the_releases_between(write_profiles, base_yaml) -> None:
    """--mamba-scheduler-strategy is live in 0.5.9, a deprecated alias of --mamba-radix-cache-strategy in 0.5.14 to
    0.5.19 and gone in 0.5.20: only the releases between know where it went."""
    body = "server:\n  extra_args: [--mamba-scheduler-strategy, no_buffer, --enable-metrics]  # the author's note\n"
    store = write_profiles(_child(base_yaml, body))
    alone = _plan(store, "c", "0.5.23", patch_targets={})
    (refusal,) = alone.refusals
    assert "SGLang 0.5.23 has no --mamba-scheduler-strategy, and no successor is known" in refusal.message
    between = [load_catalogue(v) for v in ("0.5.19", "0.5.14")]
    mig = _plan(store, "c", "0.5.23", patch_targets={}, history=between)
    assert mig.refusals == []
    want = "  extra_args: [--mamba-radix-cache-strategy, no_buffer, --enable-metrics]  # the author's note\n"
    assert want in mig.text
    (change,) = [c for c in mig.changes if c.path == "server.extra_args.0"]
    assert (change.old, change.new) == ("--mamba-scheduler-strategy", "--mamba-radix-cache-strategy")
    assert "SGLang 0.5.19 deprecates --mamba-scheduler-strategy" in change.source


def test_as_new_writes_a_profile_that_extends_the_old_one(shipped) -> None:
    mig = _plan(shipped, "glm5-tp8", "0.5.23", patch_targets={}, new_name="x")
    from toolkit.core.profile.source import parse_profile_text

    doc = parse_profile_text("x", "x.yaml", mig.text).data
    assert doc["extends"] == "glm5-tp8" and doc["engine"] == {
        "sglang_version": "0.5.23", "patches": []
    }
    assert "--dsa-decode-backend trtllm" in doc["why"]["engine.sglang_version"]["reason"]
    assert "results" not in doc and "server" not in doc


def _scratch(tmp_path: Path) -> Path:
    """A repository with the shipped profiles, patches and lock files (the 0.5.23 lock is there: no wheel needed)."""
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    (tmp_path / ".git").mkdir()
    return tmp_path / "profiles"


def test_migrate_write_then_everything_validates_and_parses_as_the_release_does(tmp_path: Path, capsys,
                                                                               monkeypatch) -> None:
    """The issue's sequence: migrate --write, validate all, render; the render parses under 0.5.23's parser (the
    stand-in's, built from 0.5.23's catalogue) and the unmigrated one does not."""
    from toolkit.cli.main import main
    from toolkit.lab.standin_server.server import sglang_parser

    profiles = _scratch(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = ProfileStore(profiles).resolve("glm5-tp8")
    unmigrated = render_launch_argv(before)
    assert main(["profile", "migrate", "glm5-tp8", "--sglang-version", "0.5.23"]) == 0  # dry run
    assert (profiles / "glm5-tp8.yaml").read_text() == (REPO / "profiles/glm5-tp8.yaml").read_text()
    out = capsys.readouterr().out
    assert "server.nsa_decode_backend: --nsa-decode-backend trtllm -> --dsa-decode-backend trtllm" in out
    assert "+  sglang_version: 0.5.23" in out and "dry run" in out
    assert main(["profile", "migrate", "glm5-tp8", "--sglang-version", "0.5.23", "--write"]) == 0
    assert main(["profile", "validate", "all"]) == 0
    after = ProfileStore(profiles)
    catalogue = json.loads((REPO / "toolkit/data/sglang_flags/0.5.23.json").read_text())
    parser = sglang_parser(catalogue)
    for name in ("glm5-tp8", "glm5-tp4-pp2", "glm5-ep8"):
        resolved = after.resolve(name)
        assert resolved.spec.engine.sglang_version == "0.5.23" and resolved.spec.engine.patches == []
        argv = render_launch_argv(resolved)[3:]
        assert [a for a in argv if a.startswith("--") and load_catalogue("0.5.23").get(a) is None] == []
        parser.parse_args(argv)  # argparse would exit 2
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(unmigrated[3:])
    assert refused.value.code == 2
    assert "unrecognized arguments: --nsa-decode-backend trtllm" in capsys.readouterr().err


def test_migrate_refuses_and_writes_nothing(tmp_path: Path, capsys, monkeypatch) -> None:
    from toolkit.cli.main import main

    profiles = _scratch(tmp_path)
    monkeypatch.chdir(tmp_path)
    text = (profiles / "glm5-tp8.yaml").read_text().replace("  radix_cache: false\n",
                                                            "  radix_cache: false\n  kv_cache_dtype: fp4_e2m1\n")
    (profiles / "glm5-tp8.yaml").write_text(text)
    assert main(["profile", "migrate", "glm5-tp8", "--sglang-version", "0.5.23", "--write"]) == 2
    assert (profiles / "glm5-tp8.yaml").read_text() == text
    err = capsys.readouterr().err
    assert "server.kv_cache_dtype: SGLang 0.5.23's --kv-cache-dtype no longer accepts 'fp4_e2m1'" in err
    assert main(["profile", "migrate", "glm5-tp8", "--sglang-version", "0.4.0"]) == 2
    assert "no flag catalogue for SGLang 0.4.0" in capsys.readouterr().err


def test_flaginfo_of_a_bare_catalogue() -> None:
    cat = Catalogue("x", [FlagInfo(["--a"], nargs=0, deprecated=True), FlagInfo(["--b"], error="gone")])
    assert not cat.live("--a") and not cat.live("--b") and not cat.live("--c")
