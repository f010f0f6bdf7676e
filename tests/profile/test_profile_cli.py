"""The profile commands end to end (in-process, real files)."""

from __future__ import annotations

import json
from pathlib import Path

from toolkit.cli.main import main

PROFILES = str(Path(__file__).resolve().parents[2] / "profiles")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["profile", *argv, "--profiles-dir", PROFILES])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_validate_all_passes(capsys) -> None:
    code, out, _ = run(capsys, "validate", "all")
    assert code == 0
    assert [line.split()[:2] for line in out.splitlines() if not line.startswith(" ")] == [
        ["ok", "glm5-baseline"], ["ok", "glm5-ep8"], ["ok", "glm5-tp4-pp2"], ["ok", "glm5-tp8"],
        ["ok", "glm5-tp8-0.5.23"],
    ]  # fmt: skip


def test_strict_turns_warnings_into_errors(capsys) -> None:
    code, _, err = run(capsys, "validate", "glm5-baseline", "--strict")
    assert code == 2 and "[sm120-nsa-cuda-graph]" in err


def test_list_json(capsys) -> None:
    code, out, _ = run(capsys, "list", "--json")
    rows = {r["name"]: r for r in json.loads(out)}
    assert (
        code == 0
        and rows["glm5-tp8"]["extends"] == "glm5-baseline"
        and rows["glm5-baseline"]["sglang_version"] == "0.5.9"
    )


def test_show_resolved_says_where_each_value_is_set(capsys) -> None:
    code, out, _ = run(capsys, "show", "glm5-ep8", "--resolved")
    assert code == 0
    assert "server.ep_size = 8    # glm5-ep8:" in out
    assert "server.max_running_requests = 1024    # glm5-tp8:" in out
    assert "target.gpu_count = 8    # glm5-baseline:" in out
    assert "server.chunked_prefill_size = null    # default" in out


def test_show_plain_is_the_file(capsys) -> None:
    code, out, _ = run(capsys, "show", "glm5-tp8")
    assert code == 0 and out == (Path(PROFILES) / "glm5-tp8.yaml").read_text()


def test_render_shows_all_five(capsys) -> None:
    code, out, _ = run(capsys, "render", "glm5-tp8")
    assert code == 0
    for heading in ("# launch argv", "# environment", "# systemd unit", "# SGLang --config YAML", "# benchmark"):
        assert heading in out
    code, out, _ = run(capsys, "render", "glm5-tp8", "--only", "argv", "--json")
    assert json.loads(out)[:3] == ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server"]


def test_unknown_profile_names_the_known_ones(capsys) -> None:
    code, _, err = run(capsys, "show", "glm5-tp16")
    assert code == 2 and "no profile 'glm5-tp16'" in err and "glm5-tp8" in err


def test_closed_pipe_ends_quietly() -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        # `true` exits at once, so the pipe is closed before the toolkit writes a byte.
        f"{sys.executable} -m toolkit profile show glm5-tp8 --resolved --profiles-dir {PROFILES} | true",
        shell=True,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
