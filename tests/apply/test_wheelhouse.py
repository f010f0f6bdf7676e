"""The wheelhouse's layout on the controller: one directory and one tar per SGLang release."""

from __future__ import annotations

import tarfile
from pathlib import Path

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
