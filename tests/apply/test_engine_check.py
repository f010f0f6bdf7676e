"""roles/sglang_venv/files/engine_check.py, run for real: a venv made in a temporary directory, real wheels
installed into it by pip, and the check run with that venv's own python, as the role and the stand-in
server run it."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "roles/sglang_venv/files/engine_check.py"
LOCK = "profiles/requirements/sglang-0.5.9-cp311.lock"


def make_wheel(directory: Path, name: str, version: str, body: str = "", requires: tuple[str, ...] = ()) -> Path:
    """A real wheel of one package `name` (its module is the name with '-' as '_'), declaring `requires`."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": body or f"VERSION = {version!r}\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                            + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(t.encode())}" for p, t in files.items()]
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = directory / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for arc, text in files.items():
            zf.writestr(arc, text)
    return path


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheels")
    make_wheel(d, "alpha", "1.0")
    make_wheel(d, "beta", "2.0")
    make_wheel(d, "beta", "2.1")
    make_wheel(d, "gamma", "0.3")
    make_wheel(d, "needs-driver", "1.0",
               "raise OSError('libcuda.so.1: cannot open shared object file: No such file or directory')\n")
    make_wheel(d, "broken", "1.0", "import alpha_submodule_that_is_not_there\n")
    return d


def make_venv(tmp: Path, wheels: Path, *names: str) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin/python"), "install", "-q",
                    "--disable-pip-version-check", "--no-index", "--find-links", str(wheels), "--no-deps", *names],
                   check=True)
    return venv


def run_check(venv: Path, inputs: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    path = venv / "toolkit-engine-check.json"
    path.write_text(json.dumps(inputs))
    proc = subprocess.run([str(venv / "bin/python"), str(SCRIPT), str(path)], capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def inputs(distributions: dict[str, str], imports: list[tuple[str, str]] = (), **more: Any) -> dict[str, Any]:
    return {"schema": 1, "lock": LOCK, "lock_digest": "d" * 64, "distributions": distributions,
            "imports": [{"module": m, "distribution": d} for m, d in imports], **more}


def test_a_venv_equal_to_its_lock_passes(tmp_path: Path, wheels: Path) -> None:
    venv = make_venv(tmp_path, wheels, "alpha==1.0", "beta==2.0")
    rc, result = run_check(venv, inputs({"alpha": "1.0", "beta": "2.0"}, [("alpha", "alpha"), ("beta", "beta")]))
    assert (rc, result["ok"]) == (0, True), result
    assert [i["status"] for i in result["imports"]] == ["ok", "ok"]
    assert result["prefix"] == str(venv)


def test_missing_other_version_and_extra_are_each_named(tmp_path: Path, wheels: Path) -> None:
    venv = make_venv(tmp_path, wheels, "beta==2.1", "gamma==0.3")
    rc, result = run_check(venv, inputs({"alpha": "1.0", "Beta": "2.0"}))
    assert rc == 1 and not result["ok"]
    assert result["missing"] == ["alpha==1.0"]
    assert result["other_version"] == ["beta 2.1 (the lock: beta==2.0)"]
    assert result["extra"] == ["gamma 0.3"]
    error = result["error"]
    assert f"differs from its lock {LOCK}" in error
    assert "missing alpha==1.0" in error and "other version beta 2.1" in error and "not in the lock gamma 0.3" in error


def test_a_missing_module_names_its_lock_line(tmp_path: Path, wheels: Path) -> None:
    venv = make_venv(tmp_path, wheels, "beta==2.0")
    rc, result = run_check(venv, inputs({"alpha": "1.0", "beta": "2.0"}, [("beta", "beta"), ("alpha", "alpha")]))
    assert rc == 1
    assert ("import alpha failed (ModuleNotFoundError: No module named 'alpha'); the lock line that should bring "
            f"it: alpha==1.0 in {LOCK}") in result["error"]
    assert [i["status"] for i in result["imports"]] == ["ok", "failed"]


def test_a_module_that_fails_only_for_want_of_cuda_passes_and_a_broken_one_does_not(tmp_path: Path,
                                                                                     wheels: Path) -> None:
    venv = make_venv(tmp_path, wheels, "needs-driver==1.0", "broken==1.0")
    rc, result = run_check(venv, inputs({"needs-driver": "1.0", "broken": "1.0"},
                                        [("needs_driver", "needs-driver"), ("broken", "broken")]))
    assert rc == 1
    assert [i["status"] for i in result["imports"]] == ["no-cuda", "failed"]
    assert any("import needs_driver: CUDA absent here" in n for n in result["notes"])
    assert "import broken failed (ModuleNotFoundError: No module named 'alpha_submodule_that_is_not_there')" in \
        result["error"]


def test_an_extra_wheel_counts_at_its_own_version(tmp_path: Path, wheels: Path) -> None:
    venv = make_venv(tmp_path, wheels, "alpha==1.0", "beta==2.1", "gamma==0.3")
    rc, result = run_check(venv, inputs({"alpha": "1.0", "beta": "2.0"},
                                        extra_wheels=["beta-2.1-py3-none-any.whl", "gamma-0.3-py3-none-any.whl"]))
    assert (rc, result["ok"]) == (0, True), result
    assert "beta 2.1 (an extra wheel, in place of the lock's beta==2.0)" in result["notes"]


def test_unreadable_inputs_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "absent.json")], capture_output=True,
                          text=True)
    assert proc.returncode == 2
    assert "cannot read the check's inputs" in json.loads(proc.stdout)["error"]


def test_a_missing_system_library_is_named_as_such_not_as_a_lock_line() -> None:
    """sgl-kernel's library links libnuma.so.1, which Proxmox's debian-12-standard lacks: the import fails with the
    loader's message (seen installing the real 0.5.9 lock in the lab). The lock cannot bring a system library, so
    the check names the library and the Debian package route instead of sending the operator to the lock."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("engine_check_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    detail = ("ImportError: libnuma.so.1: cannot open shared object file: No such file or directory\n"
              "- ModuleNotFoundError: No module named 'common_ops'")
    assert module.missing_library(detail) == "libnuma.so.1"
    assert module.missing_library("ModuleNotFoundError: No module named 'torch'") == ""
