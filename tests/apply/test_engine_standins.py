"""The lab's stand-ins for the engine lock's GPU-only lines (toolkit/lab/engine_standins.py) and the lab lock that
names them; a stand-in wheel installed by pip into a real venv and imported there."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from tests.apply.test_engine_check import make_venv
from toolkit.adapters.profile_store import ProfileStore
from toolkit.core.deploy import engine_imports
from toolkit.core.engine_lock import parse_lock
from toolkit.lab.deploy_overlay import narrowed_imports
from toolkit.lab.engine_standins import MARK, lab_lock

REPO = Path(__file__).resolve().parents[2]
LOCK = "profiles/requirements/sglang-0.5.9-cp311.lock"


def test_the_lab_lock_replaces_the_gpu_only_lines_marks_them_and_keeps_the_rest(tmp_path: Path) -> None:
    real = parse_lock((REPO / LOCK).read_text(), LOCK)
    lab = lab_lock(real, Path(LOCK).name, tmp_path)
    assert {"torch", "triton", "sgl-kernel", "flashinfer-python", "flashinfer-cubin", "nvidia-nccl-cu12",
            "torchvision", "cuda-bindings"} <= set(lab.standins)
    # Pure-Python wheels outside the import-bearing families stay real; so does everything not GPU-only.
    assert not {"nvidia-ml-py", "cuda-pathfinder", "transformers", "sglang", "numpy"} & set(lab.standins)
    assert len(lab.standins) + len(lab.real) == len(real.entries) == len(lab.lock.entries)
    for name, wheel in lab.standins.items():
        entry, was = lab.lock.get(name), real.get(name)
        assert entry is not None and was is not None and entry.version == was.version
        assert entry.sha256s == (hashlib.sha256(wheel.read_bytes()).hexdigest(),) != was.sha256s
        assert f"{MARK}: {name}\n# wheel: {wheel.name}\n" in lab.text
    assert lab.lock.get("transformers") == real.get("transformers")
    assert lab.text.startswith("# LAB LOCK (toolkit lab)") and lab.lock.digest != real.digest
    # Built again, the same bytes (the lab lock's digest names its wheelhouse).
    assert lab_lock(real, Path(LOCK).name, tmp_path / "again").text == lab.text


def test_a_standin_installs_under_its_real_name_and_says_what_it_is_when_imported(tmp_path: Path) -> None:
    real = parse_lock((REPO / LOCK).read_text(), LOCK)
    lab = lab_lock(real, Path(LOCK).name, tmp_path / "wheels", {"torch", "flashinfer-python"})
    flat = tmp_path / "flat"  # one --find-links directory, as a lock's wheelhouse is
    flat.mkdir()
    for wheel in lab.standins.values():
        shutil.copy(wheel, flat)
    venv = make_venv(tmp_path, flat, "torch==2.9.1", "flashinfer-python==0.6.3", "torchvision==0.24.1")
    proc = subprocess.run([str(venv / "bin/python"), "-c",
                           "import importlib.metadata as m, importlib.util as u, torch, flashinfer; "
                           "print(torch.__version__, m.version('torch'), torch.LAB_STANDIN, m.version('torchvision'), "
                           "u.find_spec('torchvision')); torch.cuda"], capture_output=True, text=True)
    # torchvision is installed (the distribution check sees it) but not importable as torchvision: the engine check
    # does not import it, and a library looking for it (transformers) must find it absent, not a stand-in.
    assert proc.stdout.split() == ["2.9.1", "2.9.1", "True", "0.24.1", "None"]
    assert "[lab] torch is a lab stand-in for torch 2.9.1: no GPU here" in proc.stderr
    assert "[lab] flashinfer is a lab stand-in for flashinfer-python 0.6.3" in proc.stderr
    assert "AttributeError: torch.cuda: torch is a lab stand-in for torch 2.9.1 and has nothing of it" in proc.stderr
    assert set(lab.standins) >= {"torch", "flashinfer-python"}


def test_a_lab_lock_whose_engine_check_imports_a_standin_keeps_its_file_when_another_is_built_beside_it(
        tmp_path: Path) -> None:
    # Two profiles of one release: the engine check of one imports flashinfer, of the other not. Their stand-ins
    # of flashinfer-python share a file name; built into one directory, the second build rewrote the file the
    # first lock had hashed, and installing the first lock then met the second's bytes (a hash mismatch).
    real = parse_lock((REPO / LOCK).read_text(), LOCK)
    imports_it = lab_lock(real, Path(LOCK).name, tmp_path, {"flashinfer-python"})
    lab_lock(real, Path(LOCK).name, tmp_path)  # the other profile's, beside it
    for name, wheel in imports_it.standins.items():
        entry = imports_it.lock.get(name)
        assert entry is not None and entry.sha256s == (hashlib.sha256(wheel.read_bytes()).hexdigest(),), name


def test_the_lab_checks_the_standins_imports_and_says_which_it_drops() -> None:
    real = parse_lock((REPO / LOCK).read_text(), LOCK)
    lab_names = {e.name for e in real.entries if e.name.startswith(("torch", "triton", "sgl-kernel", "flashinfer"))}
    imports, dropped = narrowed_imports(engine_imports(ProfileStore(REPO / "profiles").resolve("glm5-tp8")), lab_names)
    assert [i.module for i in imports] == ["torch", "triton", "sgl_kernel", "flashinfer"]
    assert dropped == ["sglang.srt.server_args"]
