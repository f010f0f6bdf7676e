"""`toolkit profile lock` end to end with pip's real resolver, against a package index built here (PEP 503 pages
over wheels made in the test), so it runs without a network: the lock written, re-run unchanged, `--check`
passing a lock the index has moved past and failing one that is not closed or whose pins conflict, a release
the index cannot complete refused with what pins the missing requirement."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from toolkit.cli.main import main
from toolkit.core.engine_lock import format_lock, lock_path, parse_lock, parse_refusal, refusal_path

pytestmark = pytest.mark.slow


def _publish(index: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A pure-Python wheel of `name` on the index, and the project's page listing every file with its sha256."""
    project = index / name
    project.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(project / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{name}/__init__.py", "")
        whl.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                     + "".join(f"Requires-Dist: {r}\n" for r in requires))
        whl.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{dist}/RECORD", "")
    links = [f'<a href="{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">{w.name}</a>'
             for w in sorted(project.glob("*.whl"))]
    (project / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")


def test_lock_check_and_refusal_against_an_index(tmp_path: Path, capsys) -> None:
    index, profiles = tmp_path / "simple", tmp_path / "repo" / "profiles"
    profiles.mkdir(parents=True)
    _publish(index, "sglang", "0.0.1", ("depa==1.0",))
    _publish(index, "depa", "1.0", ("depb>=2",))
    _publish(index, "depb", "2.1")
    _publish(index, "sglang", "0.0.2", ("depa==1.0", "missingdep==3.0"))
    common = ["--python", "3.11", "--index-url", index.as_uri(), "--profiles-dir", str(profiles)]

    assert main(["profile", "lock", "--sglang-version", "0.0.1", *common]) == 0
    lock_file = profiles.parent / lock_path("0.0.1", "3.11")
    lock = parse_lock(lock_file.read_text(), str(lock_file))
    assert [(e.name, e.version) for e in lock.entries] == [("depa", "1.0"), ("depb", "2.1"), ("sglang", "0.0.1")]
    assert f"--index-url {index.as_uri()}" in lock_file.read_text()
    assert "written" in capsys.readouterr().out
    # Another pip that finds the same engine leaves the file alone, header and all: git sees no change.
    lock_file.write_text(lock_file.read_text().replace("# pip: ", "# pip: 1.0 was "))
    before = lock_file.read_text()
    assert main(["profile", "lock", "--sglang-version", "0.0.1", *common]) == 0
    assert "unchanged" in capsys.readouterr().out and lock_file.read_text() == before

    # A newer depb: the committed lock is no longer what pip would pick, but it is still a whole engine on the
    # index: the check passes (a re-lock is what moves it).
    _publish(index, "depb", "2.2")
    assert main(["profile", "lock", "--sglang-version", "0.0.1", "--check", *common]) == 0
    assert "closed" in capsys.readouterr().out
    assert lock_file.read_text() == before  # --check wrote nothing
    # A lock that lacks a package is not closed: pip adds it.
    lock_file.write_text(format_lock(dataclasses.replace(lock, entries=tuple(e for e in lock.entries
                                                                             if e.name != "depb"))))
    assert main(["profile", "lock", "--sglang-version", "0.0.1", "--check", *common]) == 1
    assert "+ depb==2.2 (pip adds it)" in capsys.readouterr().out
    # Pins that cannot hold together (depa needs depb>=2): pip's own account of the conflict.
    _publish(index, "depb", "1.5")
    lock_file.write_text(before.replace("depb==2.1", "depb==1.5"))
    assert main(["profile", "lock", "--sglang-version", "0.0.1", "--check", *common]) == 1
    out = capsys.readouterr().out
    assert "the committed versions cannot all be installed together" in out and "depb" in out
    lock_file.write_text(before)

    assert main(["profile", "lock", "--sglang-version", "0.0.2", *common]) == 2
    err = capsys.readouterr().err
    assert f"{index.as_uri()} has no missingdep==3.0 (required by sglang==0.0.2)" in err
    refused = profiles.parent / refusal_path("0.0.2", "3.11")
    refusal = parse_refusal(refused.read_text(), str(refused))
    assert (refusal.missing, refusal.required_by) == ("missingdep==3.0", "sglang==0.0.2")
    assert not (profiles.parent / lock_path("0.0.2", "3.11")).exists()

    _publish(index, "missingdep", "3.0")  # the index gets it: the lock replaces the refusal
    assert main(["profile", "lock", "--sglang-version", "0.0.2", *common]) == 0
    assert (profiles.parent / lock_path("0.0.2", "3.11")).is_file() and not refused.exists()


def test_migrate_write_locks_the_new_release_first_and_a_refused_one_moves_nothing(tmp_path: Path, capsys,
                                                                                    monkeypatch) -> None:
    """0.5.23 with its committed locks removed: the dry run says it would lock; --write asks pip, which finds
    sglang 0.5.23 on this index but not what it pins, so the refusals are written for both Pythons, said, and the
    profile stays on 0.5.9."""
    import shutil

    repo = Path(__file__).resolve().parents[2]
    shutil.copytree(repo / "profiles", tmp_path / "profiles")
    (tmp_path / ".git").mkdir()
    for python in ("3.11", "3.13"):
        for rel in (lock_path("0.5.23", python), refusal_path("0.5.23", python)):
            (tmp_path / rel).unlink(missing_ok=True)
    index = tmp_path / "simple"
    _publish(index, "sglang", "0.5.23", ("torch==2.14.1",))
    monkeypatch.chdir(tmp_path)
    profile = (tmp_path / "profiles" / "glm5-tp8.yaml").read_text()
    argv = ["profile", "migrate", "glm5-tp8", "--sglang-version", "0.5.23", "--index-url", index.as_uri()]
    assert main(argv) == 0
    assert "it resolves and writes the missing engine locks first" in capsys.readouterr().out
    assert main([*argv, "--write"]) == 2
    out, err = capsys.readouterr()
    for python in ("3.11", "3.13"):
        refused = tmp_path / refusal_path("0.5.23", python)
        assert f"wrote {refusal_path('0.5.23', python)}" in out
        assert parse_refusal(refused.read_text(), str(refused)).missing == "torch==2.14.1"
    assert "has no torch==2.14.1 (required by sglang==0.5.23)" in err and "glm5-tp8.yaml is not moved" in err
    assert (tmp_path / "profiles" / "glm5-tp8.yaml").read_text() == profile
