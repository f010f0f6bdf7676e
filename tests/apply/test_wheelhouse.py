"""The wheelhouse's layout on the controller: one directory and one tar per lock, the probe's wheels per CPython."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from toolkit.adapters import wheelhouse


def test_each_lock_gets_its_own_tar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Path.with_suffix cut `sglang-0.5.9-...` to `sglang-0.5.tar`: 0.5.9 and 0.5.10 shared one tar,
    # and whichever release was built last shipped its wheels to the other's apply.
    monkeypatch.setenv("TOOLKIT_WHEELHOUSE_DIR", str(tmp_path))
    tars = {}
    for version in ("0.5.9", "0.5.10", "0.6.0rc1"):
        dest = wheelhouse.lock_directory(f"sglang-{version}-0123456789abcdef")
        dest.mkdir(parents=True)
        (dest / f"sglang-{version}-py3-none-any.whl").write_bytes(version.encode())
        tars[version] = wheelhouse._tarball(dest)
    assert len(set(tars.values())) == 3
    for version, tar in tars.items():
        assert tar.parent == tmp_path / "locks" and tar.name.startswith(f"sglang-{version}-")
        with tarfile.open(tar) as fh:
            assert fh.getnames() == [f"sglang-{version}-py3-none-any.whl"]


def test_the_probe_directory_names_its_python(tmp_path: Path) -> None:
    assert wheelhouse.probe_directory(tmp_path, "3.11") != wheelhouse.probe_directory(tmp_path, "3.13")
    assert wheelhouse.probe_directory(tmp_path, "3.13").name == "probe-cp313"


def test_the_same_wheels_give_the_same_tar_bytes(tmp_path: Path) -> None:
    dest = tmp_path / "locks" / "sglang-0.5.9-0123456789abcdef"
    dest.mkdir(parents=True)
    for name in ("b-1-py3-none-any.whl", "a-1-py3-none-any.whl", "partial.whl.tmp"):
        (dest / name).write_bytes(name.encode())
    first = wheelhouse._tarball(dest).read_bytes()
    (dest / "a-1-py3-none-any.whl").touch()  # a newer mtime, the same bytes
    assert wheelhouse._tarball(dest).read_bytes() == first
    with tarfile.open(wheelhouse.tarball_path(dest)) as fh:
        assert fh.getnames() == ["a-1-py3-none-any.whl", "b-1-py3-none-any.whl"]  # sorted, no .tmp


@pytest.mark.usefixtures("pypi")
def test_the_probes_wheels_are_its_requirements_for_the_locks_python_once(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """What the probe's venv installs on a host (bench_probe_requirements) and nothing of SGLang's: each of
    PROBE_REQUIREMENTS has a wheel for CPython 3.11 (pyyaml's own build for it), downloaded once; the toolkit's
    wheel is this checkout's."""
    repo = Path(__file__).resolve().parents[2]
    first = wheelhouse.probe_wheels("3.11", repo_root=repo, root=tmp_path)
    names = {p.name.split("-")[0].lower().replace("_", "-") for p in first.runtime}
    assert set(wheelhouse.PROBE_REQUIREMENTS) <= names and "sglang" not in names and "numpy" not in names
    pyyaml = next(p.name for p in first.runtime if p.name.lower().startswith("pyyaml-"))
    assert "-cp311-" in pyyaml or "-abi3-" in pyyaml
    assert first.built and first.toolkit_wheel.name.startswith("gpu_serving_toolkit-")
    monkeypatch.setattr(wheelhouse, "_pip_download", lambda *a, **k: pytest.fail("downloaded again"))
    again = wheelhouse.probe_wheels("3.11", repo_root=repo, root=tmp_path)
    assert not again.built and again.runtime == first.runtime and again.toolkit_wheel == first.toolkit_wheel


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
