"""The engine lock's file formats and comparisons (toolkit/core/engine_lock.py): pure, milliseconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolkit.core.engine_lock import (
    PLATFORM_TAGS,
    EngineLock,
    LockEntry,
    LockRefusal,
    compare,
    format_lock,
    format_refusal,
    lock_path,
    lock_problems,
    parse_lock,
    parse_refusal,
    profile_lock_paths,
    refusal_path,
    subset,
)
from toolkit.core.errors import ToolkitError

REPO = Path(__file__).resolve().parents[2]
H1, H2, H3 = "a" * 64, "b" * 64, "c" * 64


def _lock(*entries: LockEntry, release: str = "0.5.9") -> EngineLock:
    return EngineLock(release, "3.11", (LockEntry("sglang", release, (H3,), f"sglang-{release}-py3-none-any.whl"),
                                        *entries), pip_version="23.2.1")


def test_paths_follow_release_and_python() -> None:
    assert lock_path("0.5.9", "3.11") == "profiles/requirements/sglang-0.5.9-cp311.lock"
    assert refusal_path("0.5.23", "3.13") == "profiles/requirements/sglang-0.5.23-cp313.lock.refused"
    with pytest.raises(ToolkitError, match="not a CPython version"):
        lock_path("0.5.9", "311")
    with pytest.raises(ToolkitError, match="not an SGLang release"):
        lock_path("../0.5.9", "3.11")


def test_round_trip_sorts_by_normalized_name() -> None:
    lock = _lock(LockEntry("torch", "2.9.1", (H1,), "torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl"),
                 LockEntry("flashinfer-python", "0.6.3", (H2, H1)))
    text = format_lock(lock)
    again = parse_lock(text, "x.lock")
    assert again == lock
    assert format_lock(again) == text
    assert again.names == ("flashinfer-python", "sglang", "torch")
    assert again.get("Flashinfer_Python") == LockEntry("flashinfer-python", "0.6.3", (H2, H1))
    assert "TORCH" in again and "numpy" not in again
    assert again.get("torch").wheel.startswith("torch-2.9.1")  # type: ignore[union-attr]


def test_digest_follows_the_engine_not_the_header() -> None:
    lock = _lock(LockEntry("torch", "2.9.1", (H1,)))
    newer_pip = EngineLock(lock.sglang_version, lock.python, lock.entries, pip_version="25.0")
    other_file = _lock(LockEntry("torch", "2.9.1", (H2,)))
    assert lock.digest == newer_pip.digest
    assert lock.digest != other_file.digest


@pytest.mark.parametrize(("line", "message"), [
    ("torch>=2.9 \\\n    --hash=sha256:" + H1, "not a locked requirement"),
    ("torch==2.9.1", "not a locked requirement"),
    ("torch==2.9.1 ; sys_platform == 'linux' --hash=sha256:" + H1, "not a locked requirement"),
    ("torch==2.9.1 \\\n    --hash=sha256:" + H1 + "\nTorch==2.9.1 \\\n    --hash=sha256:" + H1, "locked twice"),
])
def test_bad_lines_are_refused_with_their_line(line: str, message: str) -> None:
    text = format_lock(_lock()) + line + "\n"
    with pytest.raises(ToolkitError, match=message) as err:
        parse_lock(text, "profiles/requirements/x.lock")
    problem = err.value.problems[0]
    assert problem.file == "profiles/requirements/x.lock"
    assert problem.line is not None and problem.line > 10
    assert "toolkit profile lock --sglang-version 0.5.9 --python 3.11" in (problem.fix or "")


def test_a_plain_requirements_file_is_not_a_lock() -> None:
    with pytest.raises(ToolkitError, match="not a toolkit engine lock") as err:
        parse_lock("sglang==0.5.9\ntorch==2.9.1\n", "profiles/requirements/sglang-0.5.9.txt")
    assert "hand-written" in (err.value.problems[0].fix or "")


def test_header_release_must_match_the_sglang_line() -> None:
    text = format_lock(_lock()).replace("# sglang: 0.5.9", "# sglang: 0.5.10")
    with pytest.raises(ToolkitError, match=r"says SGLang 0\.5\.10 but the lock has sglang==0\.5\.9"):
        parse_lock(text, "x.lock")


def test_newer_schema_is_refused() -> None:
    text = format_lock(_lock()).replace("# lock-schema: 1", "# lock-schema: 9")
    with pytest.raises(ToolkitError, match="newer than this toolkit reads"):
        parse_lock(text, "x.lock")


def test_compare_closed_added_dropped_changed() -> None:
    committed = _lock(LockEntry("torch", "2.9.1", (H1,)), LockEntry("numpy", "2.0.0", (H1,)))
    assert not compare(committed, committed)
    resolved = _lock(LockEntry("torch", "2.9.2", (H2,)), LockEntry("triton", "3.5.1", (H1,)))
    diff = compare(committed, resolved)
    assert [e.name for e in diff.added] == ["triton"]
    assert [e.name for e in diff.dropped] == ["numpy"]
    assert [(o.version, n.version) for o, n in diff.changed] == [("2.9.1", "2.9.2")]
    assert diff.lines() == ["+ triton==3.5.1 (pip adds it)", "- numpy==2.0.0 (pip no longer wants it)",
                            "~ torch==2.9.1 -> torch==2.9.2 (version)"]
    rehashed = _lock(LockEntry("torch", "2.9.1", (H2,)), LockEntry("numpy", "2.0.0", (H1,)))
    assert compare(committed, rehashed).lines() == ["~ torch==2.9.1 -> torch==2.9.1 (file (sha256))"]


def test_subset_in_lock_order_and_refuses_unknown_names() -> None:
    lock = _lock(LockEntry("torch", "2.9.1", (H1,)), LockEntry("numpy", "2.0.0", (H1,)))
    assert [e.name for e in subset(lock, ["sglang", "NumPy"])] == ["numpy", "sglang"]
    with pytest.raises(ToolkitError, match="has no triton"):
        subset(lock, ["triton"])


def test_refusal_round_trip_and_reason() -> None:
    refusal = LockRefusal("0.5.23", "3.11", "nvidia-nccl-cu13==2.30.7", "torch==2.14.1",
                          index_url="https://user:token@pypi.example/simple", pip_version="23.2.1",
                          detail="ERROR: Could not find a version that satisfies the requirement X")
    text = format_refusal(refusal)
    assert "token" not in text
    again = parse_refusal(text, refusal.path)
    assert again.missing == "nvidia-nccl-cu13==2.30.7" and again.required_by == "torch==2.14.1"
    assert again.reason() == ("SGLang 0.5.23 cannot be locked for CPython 3.11: https://pypi.example/simple has no "
                              "nvidia-nccl-cu13==2.30.7 (required by torch==2.14.1)")
    assert "--index-url https://pypi.example/simple" in again.command
    with pytest.raises(ToolkitError, match="not a toolkit lock refusal"):
        parse_refusal("missing: x\n", "y.refused")


def test_every_glibc_tag_up_to_debian_12_is_offered() -> None:
    # NVIDIA's CUDA wheels are manylinux_2_27: pip matches tags exactly, so each must be listed.
    assert "manylinux_2_27_x86_64" in PLATFORM_TAGS
    assert "manylinux_2_36_x86_64" in PLATFORM_TAGS and "manylinux_2_37_x86_64" not in PLATFORM_TAGS
    assert {"manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"} <= set(PLATFORM_TAGS)


def test_committed_locks_parse_and_carry_the_engine() -> None:
    locks = sorted((REPO / "profiles" / "requirements").glob("*.lock"))
    assert locks, "no lock is committed"
    for path in locks:
        lock = parse_lock(path.read_text(), str(path))
        assert str(path).endswith(lock.path)
        assert "torch" in lock and all(e.sha256s for e in lock.entries)
        assert format_lock(lock) == path.read_text(), f"{path} is not in the canonical format"


REFUSED_313 = format_refusal(LockRefusal("0.5.9", "3.13", "outlines_core==0.1.26", "outlines==0.1.11"))


def _files(**texts: str | None) -> dict[str, str | None]:
    paths = {"l311": lock_path("0.5.9", "3.11"), "l313": lock_path("0.5.9", "3.13"),
             "r311": refusal_path("0.5.9", "3.11"), "r313": refusal_path("0.5.9", "3.13")}
    return {paths[k]: v for k, v in texts.items()}


def test_a_profile_with_both_locks_is_clean() -> None:
    lock311, lock313 = format_lock(_lock()), format_lock(EngineLock("0.5.9", "3.13", _lock().entries))
    assert lock_problems("0.5.9", None, _files(l311=lock311, l313=lock313), profile_file="p.yaml") == []


def test_a_missing_lock_names_the_file_and_the_command() -> None:
    (problem,) = lock_problems("0.5.9", None, _files(l311=format_lock(_lock()), r313=REFUSED_313, l313=None)
                               | {lock_path("0.5.9", "3.13"): None, refusal_path("0.5.9", "3.13"): None},
                               profile_file="p.yaml")
    assert problem.severity == "error" and problem.file == "p.yaml" and problem.field == "engine.sglang_version"
    assert "profiles/requirements/sglang-0.5.9-cp313.lock does not exist" in problem.message
    assert "toolkit profile lock --sglang-version 0.5.9 --python 3.13" in (problem.fix or "")


def test_a_release_refused_on_one_python_warns_and_on_all_refuses() -> None:
    (warning,) = lock_problems("0.5.9", None, _files(l311=format_lock(_lock()), r313=REFUSED_313),
                               profile_file="p.yaml")
    assert warning.severity == "info" and warning.file == refusal_path("0.5.9", "3.13")
    assert "has no outlines_core==0.1.26 (required by outlines==0.1.11)" in warning.message
    assert "containers with CPython 3.13 are refused, those with 3.11 deploy" in warning.message
    refused_311 = format_refusal(LockRefusal("0.5.9", "3.11", "outlines_core==0.1.26", "outlines==0.1.11"))
    errors = lock_problems("0.5.9", None, _files(r311=refused_311, r313=REFUSED_313), profile_file="p.yaml")
    assert [p.severity for p in errors] == ["error", "error"]
    assert all(p.file == "p.yaml" and "cannot be locked for CPython 3.1" in p.message for p in errors)


def test_a_requirements_file_that_is_not_a_lock_is_refused_with_the_fix() -> None:
    (problem,) = lock_problems("0.5.9", "profiles/requirements/sglang-0.5.9.txt", {}, profile_file="p.yaml")
    assert problem.field == "engine.requirements" and "is not an engine lock" in problem.message
    assert "delete engine.requirements" in (problem.fix or "")


def test_named_locks_must_be_of_the_pinned_release() -> None:
    paths = profile_lock_paths("0.5.23", "profiles/requirements/custom-cp311.lock")
    assert paths == {"3.11": "profiles/requirements/custom-cp311.lock",
                     "3.13": "profiles/requirements/custom-cp313.lock"}
    files = {p: format_lock(EngineLock("0.5.9", py, _lock().entries)) for py, p in paths.items()}
    problems = lock_problems("0.5.23", "profiles/requirements/custom-cp311.lock", files, profile_file="p.yaml")
    assert len(problems) == 2 and all("locks SGLang 0.5.9" in p.message for p in problems)


def test_a_release_refused_everywhere_fails_validate_and_apply_before_any_host(tmp_path: Path, capsys) -> None:
    """validate all names the refusal; apply's check (resolve_checked, run before any playbook) raises it."""
    import shutil

    from toolkit.app.engine_lock import profile_locks
    from toolkit.app.profiles import resolve_checked
    from toolkit.cli.main import main

    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    (tmp_path / lock_path("0.5.23", "3.11")).unlink()
    (tmp_path / refusal_path("0.5.23", "3.11")).write_text(format_refusal(LockRefusal(
        "0.5.23", "3.11", "nvidia-nccl-cu13==2.30.7", "torch==2.14.1")))
    assert main(["profile", "validate", "all", "--profiles-dir", str(tmp_path / "profiles")]) == 2
    out, err = capsys.readouterr()
    status = {line.split()[1]: line.split()[0] for line in out.splitlines()}
    assert [name for name, s in status.items() if s == "FAIL"] == ["glm5-tp8-0.5.23"]
    assert set(status) == {p.stem for p in (tmp_path / "profiles").glob("*.yaml")}
    assert "glm5-tp8-0.5.23.yaml: engine.sglang_version: SGLang 0.5.23 cannot be locked for CPython 3.11: " \
           "https://pypi.org/simple has no nvidia-nccl-cu13==2.30.7 (required by torch==2.14.1)" in err
    with pytest.raises(ToolkitError, match=r"cannot be locked for CPython 3\.11"):
        resolve_checked("glm5-tp8-0.5.23", str(tmp_path / "profiles"))
    checked = resolve_checked("glm5-tp8", str(tmp_path / "profiles"))  # 0.5.9 is locked for 3.11 only
    assert profile_locks(checked.resolved, tmp_path) == {"3.11": tmp_path / lock_path("0.5.9", "3.11")}


def test_an_old_requirements_txt_gets_one_error_whose_fix_is_to_delete_it(tmp_path: Path) -> None:
    import shutil

    from toolkit.app.profiles import check_profiles, open_store

    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    base = tmp_path / "profiles" / "glm5-baseline.yaml"
    base.write_text(base.read_text().replace("  sglang_version: 0.5.9\n", "  sglang_version: 0.5.9\n"
                                             "  requirements: profiles/requirements/sglang-0.5.9.txt\n", 1))
    problems = check_profiles(open_store(str(tmp_path / "profiles")), ["glm5-baseline"])["glm5-baseline"]
    (error,) = [p for p in problems if p.severity == "error"]
    assert error.field == "engine.requirements" and "is not an engine lock" in error.message
    assert (error.fix or "").startswith("delete engine.requirements")


def test_committed_refusals_parse_and_are_canonical() -> None:
    for path in sorted((REPO / "profiles" / "requirements").glob("*.lock.refused")):
        refusal = parse_refusal(path.read_text(), str(path))
        assert str(path).endswith(refusal.path) and refusal.missing and refusal.required_by
        assert format_refusal(refusal) == path.read_text(), f"{path} is not in the canonical format"
