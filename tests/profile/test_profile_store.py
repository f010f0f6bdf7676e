"""Finding the profiles directory, and atomic writes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from toolkit.adapters.profile_store import PROFILES_ENV, ProfileStore, find_profiles_dir, read_source
from toolkit.core.errors import ToolkitError


def test_lookup_order(tmp_path: Path, monkeypatch) -> None:
    repo = tmp_path / "team"
    (repo / "profiles").mkdir(parents=True)
    (repo / "sub" / "deeper").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.delenv(PROFILES_ENV, raising=False)
    assert find_profiles_dir(None, cwd=repo / "sub" / "deeper") == (repo / "profiles").resolve()
    monkeypatch.setenv(PROFILES_ENV, str(other))
    assert find_profiles_dir(None, cwd=repo) == other.resolve()
    assert find_profiles_dir(str(repo / "profiles"), cwd=tmp_path) == (repo / "profiles").resolve()
    monkeypatch.setenv(PROFILES_ENV, str(tmp_path / "missing"))
    with pytest.raises(ToolkitError, match=PROFILES_ENV):
        find_profiles_dir(None)


def test_no_profiles_dir_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(PROFILES_ENV, raising=False)
    with pytest.raises(ToolkitError) as err:
        find_profiles_dir(None, cwd=tmp_path)
    assert "--profiles-dir" in (err.value.problems[0].fix or "")


def test_store_write_text_drops_its_cache(tmp_path: Path) -> None:
    store = ProfileStore(tmp_path)
    store.write_text("a", "schema_version: 1\nname: a\n")
    assert store.source("a").data["name"] == "a"
    store.write_text("a", "schema_version: 1\nname: a\ndescription: two\n")
    assert store.source("a").data["description"] == "two"
    with pytest.raises(ToolkitError, match="not a profile name"):
        store.path("../etc/passwd")


PATCHED = """schema_version: 1
name: p
engine:
  requirements: {req}
  patches:
    - name: x
      target: sglang/srt/a.py
      target_sha256: {sha}
      patch: profiles/patches/x.patch
      reason: r
      link: l
"""


def test_named_files_must_exist_and_the_patch_must_change_its_target(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    (profiles / "patches").mkdir(parents=True)
    (profiles / "p.yaml").write_text(PATCHED.format(req="profiles/req-cp311.lock", sha="a" * 64))
    store = ProfileStore(profiles)
    got = sorted((p.field, p.line) for p in store.file_problems(store.resolve("p")))
    assert got == [("engine.patches.0.patch", 9), ("engine.requirements", 4)]
    (profiles / "req-cp311.lock").write_text("sglang==0.5.9\n")
    (profiles / "patches" / "x.patch").write_text("--- a/sglang/srt/b.py\n+++ b/sglang/srt/b.py\n@@ -1 +1 @@\n-a\n+b\n")
    (p,) = store.file_problems(store.resolve("p"))
    assert p.field == "engine.patches.0.target" and "sglang/srt/b.py" in p.message
    (profiles / "patches" / "x.patch").write_text("--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n@@ -1 +1 @@\n-a\n+b\n")
    assert store.file_problems(store.resolve("p")) == []


def test_named_files_that_link_out_of_the_profiles_tree_are_refused(tmp_path: Path) -> None:
    """A lexically clean path (profiles/...) that is a symbolic link to a file elsewhere: the deploy would copy
    that file to every host, so it is refused once the link is followed."""
    profiles = tmp_path / "profiles"
    (profiles / "patches").mkdir(parents=True)
    outside = tmp_path / "secret.txt"
    outside.write_text("not for hosts\n")
    (profiles / "req-cp311.lock").symlink_to(outside)
    (profiles / "patches" / "x.patch").symlink_to(outside)
    (profiles / "p.yaml").write_text(PATCHED.format(req="profiles/req-cp311.lock", sha="a" * 64))
    store = ProfileStore(profiles)
    problems = {p.field: p for p in store.file_problems(store.resolve("p"))}
    assert set(problems) == {"engine.requirements", "engine.patches.0.patch"}
    assert all("outside the profiles' tree" in p.message and str(outside) in p.message for p in problems.values())


def test_a_huge_profile_is_refused_after_reading_its_limit_only(tmp_path: Path) -> None:
    """/dev/zero never ends: the reader stops one byte past the loader's limit and says so."""
    from toolkit.core.profile.source import MAX_PROFILE_BYTES

    with pytest.raises(ToolkitError) as err:
        read_source("/dev/zero", "huge")
    (p,) = err.value.problems
    assert f"{MAX_PROFILE_BYTES + 1:,} bytes or more" in p.message and p.line == 1 and "keep_last" in p.fix
    (tmp_path / "huge.yaml").symlink_to("/dev/zero")
    with pytest.raises(ToolkitError, match="not a regular file"):
        ProfileStore(tmp_path).source("huge")


def test_shipped_profiles_name_files_that_exist(shipped) -> None:
    for name in shipped.names():
        assert shipped.file_problems(shipped.resolve(name)) == [], name
