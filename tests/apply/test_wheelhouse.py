"""The wheelhouse's layout on the controller: one directory and one tar per SGLang release."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from toolkit.adapters import wheelhouse


def test_each_release_gets_its_own_tar(tmp_path: Path) -> None:
    # Path.with_suffix cut `sglang-0.5.9-cp311` to `sglang-0.5.tar`: 0.5.9 and 0.5.10 shared one tar,
    # and whichever release was built last shipped its wheels to the other's apply.
    tars = {}
    for version in ("0.5.9", "0.5.10", "0.6.0rc1"):
        dest = wheelhouse.directory(tmp_path, version)
        dest.mkdir()
        (dest / f"sglang-{version}-py3-none-any.whl").write_bytes(version.encode())
        tars[version] = wheelhouse._tarball(dest)
    assert len(set(tars.values())) == 3
    for version, tar in tars.items():
        assert tar.parent == tmp_path and tar.name.startswith(f"sglang-{version}-")
        with tarfile.open(tar) as fh:
            assert fh.getnames() == [f"sglang-{version}-py3-none-any.whl"]


def test_the_directory_names_every_target_python(tmp_path: Path) -> None:
    name = wheelhouse.directory(tmp_path, "0.5.9").name
    assert name == "sglang-0.5.9-" + "-".join("cp" + v.replace(".", "") for v in wheelhouse.TARGET_PYTHONS)
    assert {"3.11", "3.13"} <= set(wheelhouse.TARGET_PYTHONS)  # debian-12-standard and debian-13-standard


def test_the_same_wheels_give_the_same_tar_bytes(tmp_path: Path) -> None:
    dest = wheelhouse.directory(tmp_path, "0.5.9")
    dest.mkdir()
    for name in ("b-1-py3-none-any.whl", "a-1-py3-none-any.whl", "partial.whl.tmp"):
        (dest / name).write_bytes(name.encode())
    first = wheelhouse._tarball(dest).read_bytes()
    (dest / "a-1-py3-none-any.whl").touch()  # a newer mtime, the same bytes
    assert wheelhouse._tarball(dest).read_bytes() == first
    with tarfile.open(wheelhouse.tarball_path(dest)) as fh:
        assert fh.getnames() == ["a-1-py3-none-any.whl", "b-1-py3-none-any.whl"]  # sorted, no .tmp


@pytest.mark.usefixtures("pypi")
def test_a_lock_subset_fills_the_content_addressed_cache_once(tmp_path: Path) -> None:
    """Two small wheels of the committed 0.5.9 lock: downloaded by hash into files/sha256/, found there the second
    time (nothing downloaded), staged as exactly those files; a hash the index has no file for is refused."""
    import dataclasses
    import hashlib

    from toolkit.core.engine_lock import lock_path, parse_lock, subset
    from toolkit.core.errors import ToolkitError

    repo = Path(__file__).resolve().parents[2]
    lock = parse_lock((repo / lock_path("0.5.9", "3.11")).read_text(), "lock")
    entries = subset(lock, ["distro", "aiohappyeyeballs"])
    seen: list[tuple[int, int, str]] = []
    first = wheelhouse.fill_from_lock(entries, "3.11", root=tmp_path, on_progress=lambda *a: seen.append(a))
    assert sorted(first.downloaded) == ["aiohappyeyeballs", "distro"] and seen[-1][:2] == (2, 2)
    for e in entries:
        path = first.files[e.name]
        assert path.parent == tmp_path / "files" / "sha256" / e.sha256s[0][:2] / e.sha256s[0]
        assert path.name == e.wheel and hashlib.sha256(path.read_bytes()).hexdigest() == e.sha256s[0]
    again = wheelhouse.fill_from_lock(entries, "3.11", root=tmp_path)
    assert again.downloaded == () and again.files == first.files
    staged = wheelhouse.stage_lock_files(again, tmp_path / "host")
    (staged / "left-from-another-lock.whl").write_bytes(b"x")
    wheelhouse.stage_lock_files(again, staged)
    assert sorted(p.name for p in staged.iterdir()) == sorted([*(e.wheel for e in entries), "SHA256SUMS"])
    wrong = dataclasses.replace(entries[0], sha256s=("0" * 64,))
    with pytest.raises(ToolkitError, match="pip download of 1 locked wheel"):
        wheelhouse.fill_from_lock([wrong], "3.11", root=tmp_path)
