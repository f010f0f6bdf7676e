"""`toolkit profile lock` end to end with pip's real resolver, against a package index built here (PEP 503 pages
over wheels made in the test), so it runs without a network: the lock written, re-run unchanged, `--check`
finding a moved dependency, a release the index cannot complete refused with what pins the missing requirement."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from toolkit.cli.main import main
from toolkit.core.engine_lock import lock_path, parse_lock, parse_refusal, refusal_path

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

    _publish(index, "depb", "2.2")  # a newer depb: the committed lock is no longer what pip picks
    assert main(["profile", "lock", "--sglang-version", "0.0.1", "--check", *common]) == 1
    assert "~ depb==2.1 -> depb==2.2 (version)" in capsys.readouterr().out
    assert parse_lock(lock_file.read_text(), "x") == lock  # --check wrote nothing

    assert main(["profile", "lock", "--sglang-version", "0.0.2", *common]) == 2
    err = capsys.readouterr().err
    assert f"{index.as_uri()} has no missingdep==3.0 (required by sglang==0.0.2)" in err
    refused = profiles.parent / refusal_path("0.0.2", "3.11")
    refusal = parse_refusal(refused.read_text(), str(refused))
    assert (refusal.missing, refusal.required_by) == ("missingdep==3.0", "sglang==0.0.2")
    assert not (profiles.parent / lock_path("0.0.2", "3.11")).exists()
