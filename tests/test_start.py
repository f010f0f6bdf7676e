"""docs/start.md's "Measure the SGLang you already run", followed as written against a server the test starts: the
lab's stand-in SGLang server run as a plain local process (no lab, no Proxmox), to a verdict and an HTML report.

Two things differ from a user's machine, each said where it is added: this machine has no GPU (the stand-in's
simulated GPUs are the GPU source) and no SGLang to run bench_serving (a plain load of streamed completions
after `--`, the form the page gives for a benchmark of one's own)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from toolkit.adapters.sglang_catalogue import catalogue_path
from toolkit.cli.main import main
from toolkit.lab.standin_server import SERVER_PATH

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "docs" / "start.md"
LOAD = ROOT / "tests" / "fixtures" / "load" / "completions_load.py"
DOC_URL = "http://127.0.0.1:30000"


def _section_commands(title: str) -> list[list[str]]:
    """The `toolkit ...` lines of the first sh block under the heading `title`."""
    text = START.read_text()
    section = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, f"no sh block under {title!r}"
    return [shlex.split(line)[1:] for line in block.group(1).splitlines() if line.startswith("toolkit ")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def sglang() -> Iterator[str]:
    port = _free_port()
    env = {**os.environ, "SGLANG_STANDIN_STARTUP_S": "0.2", "SGLANG_STANDIN_FLAGS": str(catalogue_path("0.5.9"))}
    proc = subprocess.Popen([sys.executable, str(SERVER_PATH), "--host", "127.0.0.1", "--port", str(port),
                             "--model-path", "zai-org/GLM-4.5-Air", "--served-model-name", "glm",
                             "--max-running-requests", "48", "--enable-metrics", "--schedule-policy", "lpm"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the stand-in server never answered /health"
        time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_measure_the_sglang_you_already_run_from_the_start_page(sglang: str, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "profiles").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOOLKIT_PROFILES_DIR", str(tmp_path / "profiles"))
    imp, probe, report = _section_commands("2. Measure the SGLang you already run")
    assert (imp[:2], probe[:2], report[0]) == (["profile", "import"], ["probe", "run"], "report")

    # The stand-in answers `version: not installed` (no SGLang beside it): the page's option for that case.
    argv = [a.replace(DOC_URL, sglang) for a in imp] + ["--sglang-version", "0.5.9", "--", "python", "-m",
                                                         "sglang.launch_server", "--schedule-policy", "lpm"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    name = imp[imp.index("--name") + 1]
    spec = yaml.safe_load((tmp_path / "profiles" / f"{name}.yaml").read_text())
    # What the server runs that differs from 0.5.9's defaults, each with where it came from; what it reports by
    # default (tp 1, radix cache on) is left out.
    assert spec["server"]["max_running_requests"] == 48 and spec["server"]["enable_metrics"] is True
    assert spec["server"]["port"] == int(sglang.rsplit(":", 1)[1]) and "tp_size" not in spec["server"]
    assert spec["server"]["extra_args"] == ["--schedule-policy", "lpm"]
    assert spec["model"] == {"repo_id": "zai-org/GLM-4.5-Air", "served_model_name": "glm"}
    assert "/server_info" in spec["why"]["server.max_running_requests"]["reason"]
    assert f"toolkit probe run --profile {name}" in out
    assert main(["profile", "validate", name]) == 0
    assert capsys.readouterr().out.startswith(f"ok   {name}")

    # No GPU here: the stand-in's simulated GPUs; no bench_serving: a load of one's own after `--`.
    run_dir = tmp_path / "run"
    argv = [*probe, "--gpu-source", f"simulated:{sglang}", "--idle-s", "1", "--out", str(run_dir), "--json",
            "--", sys.executable, str(LOAD), sglang, "glm", "160", "48", "64"]
    assert main(argv) == 0
    verdict = json.loads(capsys.readouterr().out.split("\nrecorded into")[0])["data"]["verdict"]
    assert verdict["class"] and verdict["headline"] and verdict["next_steps"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steady_state"]["signal"] == "server token counter"
    assert summary["server"]["steady"]["max_running_requests"] == 48
    entries = yaml.safe_load((tmp_path / "profiles" / f"{name}.yaml").read_text())["results"]["entries"]
    assert len(entries) == 1 and entries[0]["verdict"]["class"] == verdict["class"]

    assert main(report) == 0
    html = (tmp_path / report[report.index("--html") + 1]).read_text()
    assert verdict["headline"].split(" — ")[0] in html and "<img" in html
