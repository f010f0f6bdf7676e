"""The broken-profile corpus (tests/profile/broken/, expectations in EXPECTED.yaml): each profile
gives exactly one error, at its file, line and field, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from toolkit.cli.main import main

BROKEN = Path(__file__).resolve().parent / "broken"
EXPECTED = yaml.safe_load((BROKEN / "EXPECTED.yaml").read_text())
ISSUE_CASES = {  # the first hostile-profile cases, by name
    "malformed-yaml", "empty-file", "list-not-mapping", "unknown-key", "wrong-type", "impossible-parallelism",
    "unknown-flag", "cycle-a", "missing-parent", "sm120-allreduce-fusion",
}  # fmt: skip


def test_corpus_covers_the_issue_and_every_file_has_an_expectation() -> None:
    assert set(EXPECTED) >= ISSUE_CASES
    assert {p.stem for p in BROKEN.glob("*.yaml")} - {"EXPECTED", "ok-base"} == set(EXPECTED)


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_one_clear_error(case: str, capsys) -> None:
    expect = EXPECTED[case]
    code = main(["profile", "validate", case, "--profiles-dir", str(BROKEN), "--json"])
    out = capsys.readouterr()
    assert code == 2
    if out.out.strip().startswith("{"):
        import json

        problems = json.loads(out.out)["data"][case]
    else:  # pragma: no cover - validate --json always answers JSON
        raise AssertionError(out)
    errors = [p for p in problems if p["severity"] == "error"]
    assert len(errors) == 1, errors
    (err,) = errors
    assert Path(err["file"]).name == expect["file"]
    assert err["line"] == expect["line"]
    assert err["field"] == expect["field"]
    assert expect["says"] in err["message"] + " " + (err["fix"] or "")
    assert err["fix"], "every error says how to fix it"


def test_ok_base_is_valid(capsys) -> None:
    assert main(["profile", "validate", "ok-base", "--profiles-dir", str(BROKEN)]) == 0


@pytest.mark.parametrize("case", ["malformed-yaml", "sm120-allreduce-fusion", "cycle-a", "newline-in-env",
                                  "public-bind-no-key"])
def test_the_text_error_names_file_line_and_fix(case: str, capsys) -> None:
    assert main(["profile", "validate", case, "--profiles-dir", str(BROKEN)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and f"{EXPECTED[case]['file']}:{EXPECTED[case]['line']}:" in err
    assert "\n  fix: " in err


def test_real_cli_exit_2_without_traceback() -> None:
    """The launcher (`python -m toolkit`): its exit code and stderr are main's, and no traceback."""
    case = "malformed-yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit", "profile", "validate", case, "--profiles-dir", str(BROKEN)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("error: ") and f"{EXPECTED[case]['file']}:{EXPECTED[case]['line']}:" in proc.stderr
    assert "\n  fix: " in proc.stderr


def test_apply_refuses_every_broken_profile_before_any_host_is_touched(tmp_path: Path, monkeypatch, capsys,
                                                                       reliability) -> None:
    """`toolkit apply` on each broken profile: exit 2 with the same located error, and nothing ran: no Ansible
    run directory and no run artifacts, though the inventory exists and names a host."""
    monkeypatch.setenv("TOOLKIT_STATE_DIR", str(tmp_path / "state"))
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  children:\n    gpu_containers:\n      hosts:\n"
                         "        ct: {ansible_host: 192.0.2.1}\n")
    first_lines = {}
    for case in sorted(EXPECTED):
        code = main(["apply", "profile", case, "--profiles-dir", str(BROKEN), "-i", str(inventory),
                     "--runs-dir", str(tmp_path / "runs")])
        err = capsys.readouterr().err
        assert code == 2, case
        assert f"{EXPECTED[case]['file']}:{EXPECTED[case]['line']}" in err and "\n  fix: " in err, (case, err)
        assert "Traceback" not in err
        assert not (tmp_path / "state").exists() and not (tmp_path / "runs").exists(), case
        first_lines[case] = err.splitlines()[0].split("broken/", 1)[-1]
    reliability(
        fault=f"hostile or broken profiles: the {len(EXPECTED)} of tests/profile/broken/ (bad YAML, unknown keys, "
        "a host that is no address, relative paths, a newline in an env value or an argument, an open bind "
        "without an API key, a YAML boolean or octal number where a number is meant, a typed knob overridden "
        "through an alias or a prefix in extra_args, paths out of the profiles' tree, invisible Unicode, "
        "template markers, an alias bomb, a broken results block, ...)",
        user_saw="exit 2, one error each with file:line: field, message and fix, e.g. "
        + "; ".join(f"'{first_lines[c][:150]}'" for c in ("newline-in-env", "tp-prefix-in-extra-args",
                                                            "alias-bomb")),
        recorded="nothing: no Ansible run directory, no artifacts, no host contacted",
        next_run="the profile, fixed as the error says, validates (tests/profile/test_profile_validate.py)",
        area="profile",
    )
