"""The profile commands end to end (in-process, real files)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from toolkit.cli.main import main

REPO = Path(__file__).resolve().parents[2]
PROFILES = str(REPO / "profiles")


def run(capsys, *argv: str, profiles: str = PROFILES) -> tuple[int, str, str]:
    code = main(["profile", *argv, "--profiles-dir", profiles])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_validate_all_passes(capsys) -> None:
    code, out, err = run(capsys, "validate", "all", "--strict")  # the shipped profiles acknowledge their warnings
    assert code == 0
    # Parents first; one status line each on stdout, every problem once on stderr (a parent's under the parent).
    assert [line.split()[:2] for line in out.splitlines()] == [
        ["ok", "glm5-baseline"], ["ok", "glm5-tp8"], ["ok", "glm5-2node"], ["ok", "glm5-ep8"], ["ok", "glm5-tp4-pp2"],
        ["ok", "glm5-tp8-0.5.23"], ["ok", "glm5-tp8-x2"],
    ]  # fmt: skip
    # The acknowledged and info lines are counts on the status line; --verbose prints each once.
    assert "ok   glm5-tp8 (1 acknowledged, 2 infos)\n" in out
    assert err == "(9 acknowledged/info line(s) not shown: --verbose prints them)\n"
    code, out, err = run(capsys, "validate", "all", "--strict", "--verbose")
    assert code == 0 and "2 shown under glm5-baseline, glm5-tp8" in out
    located = re.findall(r"^\w+: (\S+:\d+: \S+) ", err, re.M)  # file:line: field
    assert located and len(located) == len(set(located)), err
    assert err.count("[nsa-phase-backend-leaves-nsa]") == 1
    assert "acknowledged: " in err and "acknowledged (" in err


def test_strict_turns_warnings_into_errors(tmp_path, capsys) -> None:
    """Without its acknowledgement, glm5-baseline's warnings fail --strict; with one whose reason is empty the
    profile does not load; an acknowledgement of a rule that does not exist is a warning."""
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    path = profiles / "glm5-baseline.yaml"
    text = path.read_text()
    start, end = text.index("acknowledge:"), text.index("# --- results:")
    path.write_text(text[:start] + text[end:])
    code, out, err = run(capsys, "validate", "glm5-baseline", "--strict", profiles=str(profiles))
    assert code == 2 and out.startswith("FAIL glm5-baseline") and "[sm120-nsa-cuda-graph]" in err
    assert main(["profile", "validate", "glm5-baseline", "--profiles-dir", str(profiles)]) == 0  # warnings only
    path.write_text(text[:start] + "acknowledge:\n  sm120-nsa-cuda-graph: ''\n" + text[end:])
    code, _, err = run(capsys, "validate", "glm5-baseline", profiles=str(profiles))
    assert code == 2 and "needs a reason" in err
    path.write_text(text[:start] + "acknowledge:\n  no-such-rule: because\n" + text[end:])
    code, _, err = run(capsys, "validate", "glm5-baseline", "--strict", profiles=str(profiles))
    assert code == 2 and "acknowledge.no-such-rule: no rule is called no-such-rule" in err


def test_show_prints_an_invalid_file_marked_invalid(tmp_path, capsys) -> None:
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    bad = "schema_version: 1\nname: bad\nserver:\n  tp_sise: 8\n"
    (profiles / "bad.yaml").write_text(bad)
    code, out, err = run(capsys, "show", "bad", profiles=str(profiles))
    assert code == 2 and out == bad  # the file as written, to be fixed
    assert err.startswith("INVALID: ") and "tp_sise" in err


def test_list_json(capsys) -> None:
    code, out, _ = run(capsys, "list", "--json")
    rows = {r["name"]: r for r in json.loads(out)["data"]}
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
    assert json.loads(out)["data"][:3] == ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server"]


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
