"""Golden files for every shipped profile's render, and systemd quoting that survives any value.

Regenerate the goldens after an intended change: TOOLKIT_UPDATE_GOLDEN=1 pytest tests/profile
(then read the diff: it is the review of the change).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tests_profile_helpers import split_systemd_words  # type: ignore[import-not-found]

from toolkit.core.profile.render import (
    render_bench_argv,
    render_env,
    render_launch_argv,
    render_sglang_config_yaml,
    render_systemd_unit,
    systemd_word,
)

GOLDEN = Path(__file__).resolve().parent / "golden"
SHIPPED = ["glm5-baseline", "glm5-tp8", "glm5-tp4-pp2", "glm5-ep8", "glm5-tp8-0.5.23"]


def _renders(resolved) -> dict[str, str]:
    return {
        "argv.json": json.dumps(render_launch_argv(resolved), indent=1) + "\n",
        "env.json": json.dumps(render_env(resolved), indent=1) + "\n",
        "service": render_systemd_unit(resolved),
        "config.yaml": render_sglang_config_yaml(resolved),
        "bench.json": json.dumps(
            render_bench_argv(resolved, base_url="http://127.0.0.1:8000", output_file="/tmp/bench.jsonl"), indent=1
        )
        + "\n",
    }


@pytest.mark.parametrize("name", SHIPPED)
def test_golden_render(shipped, name: str) -> None:
    for suffix, text in _renders(shipped.resolve(name)).items():
        golden = GOLDEN / f"{name}.{suffix}"
        if os.environ.get("TOOLKIT_UPDATE_GOLDEN"):
            golden.write_text(text, encoding="utf-8")
        assert golden.read_text(encoding="utf-8") == text, f"{golden.name} differs from the render"


def test_tp8_argv_carries_the_seed_knobs(shipped) -> None:
    argv = render_launch_argv(shipped.resolve("glm5-tp8"))
    assert argv[:3] == ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server"]
    pairs = {argv[i]: argv[i + 1] for i in range(3, len(argv) - 1) if not argv[i + 1].startswith("--")}
    assert pairs["--tp-size"] == "8" and pairs["--max-running-requests"] == "1024"
    assert pairs["--nsa-decode-backend"] == "trtllm" and pairs["--moe-runner-backend"] == "flashinfer_cutlass"
    assert "--disable-cuda-graph" in argv and "--disable-radix-cache" in argv
    assert "--enable-flashinfer-allreduce-fusion" not in argv


def test_bench_defaults_are_the_story_command(shipped) -> None:
    seed = [
        "python3",
        "-m",
        "sglang.bench_serving",
        "--backend",
        "sglang-oai",
        "--model",
        "glm-5",
        "--tokenizer",
        "lukealonso/GLM-5-NVFP4",
        "--base-url",
        "http://localhost:8000",
        "--dataset-name",
        "random",
        "--num-prompts",
        "1024",
        "--random-input-len",
        "256",
        "--random-output-len",
        "128",
        "--request-rate",
        "inf",
    ]
    argv = render_bench_argv(shipped.resolve("glm5-baseline"), base_url="http://localhost:8000", output_file="o.jsonl")
    # the story's command, then where its result goes, with the per-request results the report's TTFT/ITL
    # distributions come from
    assert argv[: len(seed)] == seed and argv[len(seed) :] == ["--output-file", "o.jsonl", "--output-details"]
    argv = render_bench_argv(shipped.resolve("glm5-tp8"), base_url="u", output_file="o", max_concurrency=64)
    assert argv[argv.index("--max-concurrency") + 1] == "64"


NASTY = [
    'a "quoted" word',
    "back\\slash",
    "100%",
    "$HOME and ${PATH}",
    "tab\there",
    "new\nline",
    "semi;colon && | > <",
    "'single'",
    "",
    "ünïcødé",
    "%n%%",
]


@pytest.mark.parametrize("value", NASTY)
def test_systemd_word_round_trips(value: str) -> None:
    assert split_systemd_words(systemd_word(value)) == [value]


def test_unit_never_holds_the_key_and_expands_it_from_the_environment_file(write_profiles, base_yaml) -> None:
    store = write_profiles(
        {"base": base_yaml, "c": "schema_version: 1\nname: c\nextends: base\nserver:\n  api_key_secret: vault:k\n"}
    )
    unit = render_systemd_unit(store.resolve("c"))
    assert "EnvironmentFile=/etc/sglang/c.env" in unit
    assert re.search(r"--api-key \$\{SGLANG_API_KEY\}", unit)
    argv = render_launch_argv(store.resolve("c"))
    assert argv[argv.index("--api-key") + 1] == "${SGLANG_API_KEY}"


def test_unit_is_the_same_when_only_the_measuring_or_the_power_limit_changes(write_profiles, base_yaml) -> None:
    """A capacity search changes bench.request_rate on every point, a sweep bench.max_concurrency on every level,
    an energy tune gpu.power_limit_w (the host role sets it): none of them may touch the unit, or apply restarts a
    server that takes minutes to load its weights. A server knob does change it."""

    def unit(extra: str) -> str:
        store = write_profiles({"base": base_yaml, "c": f"schema_version: 1\nname: c\nextends: base\n{extra}"})
        return render_systemd_unit(store.resolve("c"))

    plain = unit("")
    measured = unit("bench:\n  request_rate: 17.4\n  max_concurrency: 240\n  seed: 3\nprobe:\n  server_scrape_hz: 4\n"
                    "gpu:\n  power_limit_w: 400\n")
    assert measured == plain
    changed = unit("server:\n  max_running_requests: 128\n")
    assert changed != plain
    assert changed.splitlines()[0] != plain.splitlines()[0]  # the header's server hash names the difference


def test_unit_with_hostile_values_parses_back_to_the_argv(write_profiles, base_yaml) -> None:
    body = (
        "schema_version: 1\nname: c\nextends: base\nserver:\n  extra_args: "
        + json.dumps(["--log-level", *NASTY[:-3], "%n%%"])
        + "\nenv:\n  NCCL_DEBUG_SUBSYS: 'INIT,%h \"x\" $y'\n"
    )
    store = write_profiles({"base": base_yaml, "c": body})
    resolved = store.resolve("c")
    unit = render_systemd_unit(resolved)
    exec_start = re.search(r"^ExecStart=(.*?)(?<!\\)\n", unit, re.S | re.M)
    assert exec_start is not None
    assert split_systemd_words(exec_start.group(1).replace("\\\n", " ")) == render_launch_argv(resolved)
    env_line = next(line for line in unit.splitlines() if line.startswith('Environment="NCCL_DEBUG_SUBSYS'))
    assert split_systemd_words(env_line[len("Environment=") :], expand=False) == ['NCCL_DEBUG_SUBSYS=INIT,%h "x" $y']


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_accepts_the_units(shipped, tmp_path: Path, write_profiles, base_yaml) -> None:
    """systemd's own parser reads every shipped unit (and a hostile one) without a syntax complaint."""
    units = [render_systemd_unit(shipped.resolve(n)) for n in SHIPPED]
    hostile = write_profiles(
        {
            "base": base_yaml,
            "c": "schema_version: 1\nname: c\nextends: base\nserver:\n  extra_args: "
            + json.dumps(["--log-level", *NASTY])
            + "\n",
        }
    )
    units.append(render_systemd_unit(hostile.resolve("c")))
    python = tmp_path / "opt/sglang/venv/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    for i, unit in enumerate(units):
        # verify checks that the binary exists: point ExecStart at a stand-in under tmp_path.
        path = tmp_path / f"toolkit-test-{i}.service"
        path.write_text(unit.replace("ExecStart=/opt/", f"ExecStart={tmp_path}/opt/"))
        proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, check=False)
        complaints = [
            line
            for line in proc.stderr.splitlines()
            if path.name in line or "ExecStart" in line or "Unbalanced" in line or "Invalid" in line
        ]
        assert complaints == [] and proc.returncode == 0, proc.stderr + unit


def test_percent_is_escaped_in_every_setting_of_the_unit_not_only_exec_start(write_profiles, base_yaml) -> None:
    """systemd expands %n, %h, ... in Description= as in ExecStart=: a served name `glm-%n` must show as written."""
    store = write_profiles({"base": base_yaml, "c": "schema_version: 1\nname: c\nextends: base\nmodel:\n"
                            "  served_model_name: glm-100%n\nserver:\n  api_key_secret: vault:k\n"})
    unit = render_systemd_unit(store.resolve("c"))
    settings = [line for line in unit.splitlines() if "=" in line and not line.startswith("#")]
    description = next(line for line in settings if line.startswith("Description="))
    assert description == "Description=SGLang serving glm-100%%n (toolkit profile c)"
    # No setting holds a lone % (one systemd would read as a specifier).
    for line in settings:
        assert not re.search(r"(?<!%)%(?!%)", line.replace("%%", "")), line


@pytest.mark.parametrize(("host", "url"), [
    ("127.0.0.1", "http://127.0.0.1:8000"),
    ("0.0.0.0", "http://127.0.0.1:8000"),
    ("::", "http://[::1]:8000"),
    ("::1", "http://[::1]:8000"),
    ("fd00:0:0::7", "http://[fd00::7]:8000"),
    ("fe80::1%eth0", "http://[fe80::1%25eth0]:8000"),
    ("gpu-node-1.lan", "http://gpu-node-1.lan:8000"),
])
def test_client_url_brackets_ipv6_literals_and_reaches_a_wildcard_bind_on_loopback(host: str, url: str) -> None:
    from toolkit.core.profile.render import client_url

    assert client_url(host, 8000) == url


def test_the_rendered_bench_of_an_ipv6_bind_targets_a_bracketed_url(write_profiles, base_yaml) -> None:
    from toolkit.cli.profile_cmd import _render_all

    store = write_profiles({"base": base_yaml, "c": "schema_version: 1\nname: c\nextends: base\nserver:\n"
                            "  host: '::1'\n  port: 8000\n"})
    bench = _render_all(store.resolve("c"))["bench"]
    assert bench[bench.index("--base-url") + 1] == "http://[::1]:8000"
