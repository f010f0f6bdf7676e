"""The sglang_venv role run for real (ansible-runner, connection=local) into a temporary directory.

A lock of a real SGLang wheel from PyPI and a small real wheel is installed offline from a wheelhouse into the
lock's own venv, checked and switched to; a second run changes nothing; a package removed from the venv fails
the next run before the engine path moves; another lock is another venv. A real patch is applied to one of
SGLang's files: once (changed), again (nothing changes), and with a wrong expected sha256 (refused, and nothing
in the venv changes).
"""

from __future__ import annotations

import difflib
import hashlib
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.apply.test_engine_check import make_wheel
from toolkit.adapters.ansible import run_playbook
from toolkit.adapters.wheelhouse import installer_binary, tarball_path
from toolkit.core.deploy import EngineImport, engine_check_inputs
from toolkit.core.engine_lock import EngineLock, LockEntry, format_lock

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
SGLANG_VERSION = "0.5.9"
TARGET = "sglang/version.py"


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("wheelhouse")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--disable-pip-version-check",
         "-d", str(dest), f"sglang=={SGLANG_VERSION}"],
        check=True,
    )
    make_wheel(dest, "toolkit-lock-check", "1.0")
    make_wheel(dest, "toolkit-lock-check", "1.1")
    with tarfile.open(tarball_path(dest), "w") as tar:  # the shape toolkit.adapters.wheelhouse gives
        for p in sorted(dest.iterdir()):
            tar.add(p, arcname=p.name)
    return dest


def write_lock(wheelhouse: Path, path: Path, check_version: str = "1.0") -> dict[str, Any]:
    """A real lock (the lock's own writer) of the SGLang wheel and one small wheel, and the engine check's inputs
    made from it as `toolkit apply` makes them."""
    entries = []
    for wheel in sorted(wheelhouse.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        if name == "toolkit_lock_check" and version != check_version:
            continue
        entries.append(LockEntry(name.replace("_", "-"), version, (hashlib.sha256(wheel.read_bytes()).hexdigest(),),
                                 wheel.name))
    lock = EngineLock(SGLANG_VERSION, "3.11", tuple(entries))
    path.write_text(format_lock(lock))
    # `import sglang` needs SGLang's dependencies, which this lock leaves out: the small package is imported.
    return engine_check_inputs(lock, path.name, [EngineImport("toolkit_lock_check", "toolkit-lock-check", "test")])


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _run(tmp: Path, wheelhouse: Path, patches: list[dict[str, Any]], **extra: Any) -> Any:
    if "sglang_venv_lock_src" not in extra:
        extra["sglang_venv_lock_src"] = str(tmp / "engine.lock")
        extra["sglang_venv_engine_check"] = write_lock(wheelhouse, tmp / "engine.lock")
    inventory = tmp / "inventory.ini"
    inventory.write_text(f"[local]\nlocalhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    return run_playbook(
        str(HERE / "playbooks" / "venv_local.yml"),
        inventory=inventory,
        private_data_dir=tmp / "runner",
        extravars={
            "sglang_venv_path": str(tmp / "venv"),
            "sglang_venv_sglang_version": SGLANG_VERSION,
            "sglang_venv_wheelhouse_src": str(wheelhouse),
            "sglang_venv_wheelhouse_tar": str(tarball_path(wheelhouse)),
            "sglang_venv_wheelhouse_dir": str(tmp / "wheelhouse"),
            "sglang_venv_patch_dir": str(tmp / "patches"),
            "sglang_venv_hf_home": str(tmp / "hf"),
            "sglang_venv_python": "/usr/bin/python3",
            "sglang_venv_patches": patches,
            # The installer `toolkit apply` passes (the pinned uv); a test that passes "" runs the venv's pip.
            "sglang_venv_uv_src": str(installer_binary("3.11")),
            **extra,
        },
    )


def _venvs(tmp: Path) -> list[str]:
    return sorted(p.name for p in (tmp / "venvs").iterdir())


def test_the_lock_is_installed_into_its_own_venv_checked_switched_and_never_topped_up(tmp_path: Path,
                                                                                      wheelhouse: Path) -> None:
    # A host deployed before the locks: the engine path is a plain venv directory.
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "from-before").write_text("x")
    check = write_lock(wheelhouse, tmp_path / "engine.lock")
    first = _run(tmp_path, wheelhouse, [], sglang_venv_lock_src=str(tmp_path / "engine.lock"),
                 sglang_venv_engine_check=check)
    assert first.rc == 0, first.failures
    digest = check["lock_digest"][:12]
    assert (tmp_path / "venv").is_symlink() and (tmp_path / "venv").resolve() == tmp_path / "venvs" / digest
    assert (tmp_path / "venvs" / "pre-lock" / "from-before").is_file()  # moved aside, not deleted
    assert any(e.task.startswith("Service restart asked for") for e in first.events)
    assert any(e.task.startswith("Fail the deploy when the venv cannot start SGLang") and e.kind == "ok"
               for e in first.events)
    # The check and its inputs stay beside the venv, and give the same answer when run again by hand.
    venv = tmp_path / "venvs" / digest
    rerun = subprocess.run([str(tmp_path / "venv/bin/python"), str(venv / "toolkit-engine-check.py"),
                            str(venv / "toolkit-engine-check.json")], capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    freeze = subprocess.run([str(tmp_path / "venv/bin/python"), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, check=True).stdout
    assert "toolkit_lock_check==1.0" in freeze.replace("-", "_") and f"sglang=={SGLANG_VERSION}" in freeze
    # Installed by the pinned uv, copied beside the venvs under its own version's directory.
    assert _installer(tmp_path) == "uv"
    (uv,) = (tmp_path / "tools").glob("uv-*/uv")
    assert uv.stat().st_mode & 0o111 and uv.parent.name.startswith("uv-0.")

    again = _run(tmp_path, wheelhouse, [], sglang_venv_lock_src=str(tmp_path / "engine.lock"),
                 sglang_venv_engine_check=check)
    assert again.rc == 0, again.failures
    assert again.hosts["localhost"].changed == 0
    assert not any(e.task.startswith("Service restart asked for") for e in again.events)

    # A package removed from the venv: the next run fails at the check, naming it, and nothing moves.
    subprocess.run([str(tmp_path / "venv/bin/python"), "-m", "pip", "uninstall", "-q", "-y", "toolkit-lock-check"],
                   check=True)
    broken = _run(tmp_path, wheelhouse, [], sglang_venv_lock_src=str(tmp_path / "engine.lock"),
                  sglang_venv_engine_check=check)
    assert broken.rc != 0
    message = "\n".join(f.message for f in broken.failures)
    assert "missing toolkit-lock-check==1.0" in message, message
    assert "import toolkit_lock_check failed (ModuleNotFoundError" in message
    assert "the lock line that should bring it: toolkit-lock-check==1.0 in engine.lock" in message
    assert f"remove {venv} and deploy again" in message and "nothing was switched" in message
    assert not any(e.task.startswith("Switch the engine path") for e in broken.events)

    # Another lock (the small package moved to 1.1) is another venv: made from nothing, switched to, the old kept.
    newer = write_lock(wheelhouse, tmp_path / "engine.lock", "1.1")
    moved = _run(tmp_path, wheelhouse, [], sglang_venv_lock_src=str(tmp_path / "engine.lock"),
                 sglang_venv_engine_check=newer)
    assert moved.rc == 0, moved.failures
    assert _venvs(tmp_path) == sorted([digest, newer["lock_digest"][:12], "pre-lock"])
    assert (tmp_path / "venv").resolve() == tmp_path / "venvs" / newer["lock_digest"][:12]
    assert any(e.task.startswith("Service restart asked for") for e in moved.events)


def _installer(tmp: Path) -> str:
    """What installed the lock's sglang (its dist-info's INSTALLER: `uv` or `pip`)."""
    return next(_site(tmp).glob("sglang-*.dist-info")).joinpath("INSTALLER").read_text().strip()


def _system_python() -> str:
    return subprocess.run(["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _site(tmp: Path) -> Path:
    return next((tmp / "venv" / "lib").glob("python3*/site-packages"))


def test_install_patch_idempotent_and_refuse_wrong_sha(tmp_path: Path, wheelhouse: Path) -> None:
    # 0. A venv half-made by a failed ensurepip (no python3-venv: roles review finding 6) is started over:
    #    a guard on bin/python skipped it forever and pip never existed.
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to("/usr/bin/python3")
    # 1. The real file the patch is written against, as the wheel installs it (one role run fewer than installing
    #    without patches first: each run is ~20 s of CPU, most of it Ansible's own per task).
    with zipfile.ZipFile(next(wheelhouse.glob(f"sglang-{SGLANG_VERSION}-*.whl"))) as wheel:
        original_bytes = wheel.read(TARGET)
    original = original_bytes.decode()
    sha = hashlib.sha256(original_bytes).hexdigest()
    patched = original + "# toolkit test patch: applied once\n"
    diff = "".join(difflib.unified_diff(original.splitlines(True), patched.splitlines(True),
                                        f"a/{TARGET}", f"b/{TARGET}"))
    patch_file = tmp_path / "version.patch"
    patch_file.write_text(diff)
    patches = [{"name": "test-patch", "target": TARGET, "patch_src": str(patch_file), "sha256": sha}]

    # 2. Installed (the half-made venv started over) and the patch applied.
    second = _run(tmp_path, wheelhouse, patches, sglang_venv_wheelhouse_pythons=["3.13", _system_python()])
    assert second.rc == 0, second.failures
    assert (tmp_path / "venv" / "bin" / "pip").exists()
    # The JIT toolchain check ran and passed (this machine has gcc and Python.h).
    assert any(e.task.startswith("Fail the deploy when the JIT toolchain is missing") and e.kind == "ok"
               for e in second.events)
    target = _site(tmp_path) / TARGET
    assert target.read_text() == patched
    # The patch's own task changed it (the install's tasks changed things too in this run).
    assert any(e.task.startswith("Apply the patches not applied yet") and e.kind == "changed"
               for e in second.events), sorted({(e.task, e.kind) for e in second.events if "atch" in e.task})

    # 3. Again: nothing changes (the patch reverses cleanly, so it counts as applied).
    third = _run(tmp_path, wheelhouse, patches)
    assert third.rc == 0, third.failures
    assert third.hosts["localhost"].changed == 0
    assert target.read_text().count("applied once") == 1

    # 4. A second patch whose expected file is not the installed one: refused before any patch is applied.
    other = _site(tmp_path) / "sglang" / "__init__.py"
    other_before = other.read_text()
    other_diff = "".join(difflib.unified_diff(other_before.splitlines(True),
                                              (other_before + "# must never be applied\n").splitlines(True),
                                              "a/sglang/__init__.py", "b/sglang/__init__.py"))
    (tmp_path / "init.patch").write_text(other_diff)
    good_first = {"name": "would-apply", "target": "sglang/__init__.py", "patch_src": str(tmp_path / "init.patch"),
                  "sha256": hashlib.sha256(other.read_bytes()).hexdigest()}
    wrong = {"name": "wrong-release", "target": TARGET, "patch_src": str(patch_file), "sha256": "0" * 64}
    # The wrong one's target has been patched by hand since: make it not reverse cleanly either.
    target.write_text(target.read_text().replace("applied once", "edited by hand"))
    before = _tree_digest(tmp_path / "venv")
    fourth = _run(tmp_path, wheelhouse, [good_first, wrong])
    assert fourth.rc != 0
    message = "\n".join(f.message for f in fourth.failures)
    assert "patch wrong-release refused" in message and "0" * 64 in message
    assert "nothing in the venv was changed" in message
    assert _tree_digest(tmp_path / "venv") == before
    assert "must never be applied" not in other.read_text()



def test_a_python_the_wheelhouse_has_no_wheels_for_is_refused_before_any_change(tmp_path: Path,
                                                                                  wheelhouse: Path) -> None:
    # A wheelhouse for other CPythons (as for a container made from another template): pip would fail on the
    # first per-CPython wheel after the venv was already cleared, so the role refuses in preflight.
    mine = _system_python()
    result = _run(tmp_path, wheelhouse, [], sglang_venv_wheelhouse_pythons=["3.9", "3.10"])
    assert result.rc != 0
    message = "\n".join(f.message for f in result.failures)
    assert f"/usr/bin/python3 is CPython {mine}" in message and "CPython 3.9, 3.10 only" in message, message
    assert "Nothing was changed" in message and "lxc_gpu_container_template_pattern" in message
    assert not (tmp_path / "venv").exists() and not (tmp_path / "wheelhouse").exists()


def _wheel(directory: Path, value: int) -> Path:
    """A real wheel of a one-module package whose declared dependency exists nowhere: installing it with its
    dependencies from the offline wheelhouse would fail, so a working install proves --no-deps."""
    return make_wheel(directory, "toolkit_extra_check", "1.0", f"VALUE = {value}\n",
                      requires=("toolkit-no-such-dependency",))


def _value(tmp: Path) -> str:
    return subprocess.run([str(tmp / "venv/bin/python"), "-c", "import toolkit_extra_check as m; print(m.VALUE)"],
                          capture_output=True, text=True).stdout.strip()


def _ran(result: Any, task: str) -> list[str]:
    return [e.kind for e in result.events if e.task.startswith(task) and e.kind in ("ok", "changed", "skipped")]


def test_extra_wheels_installed_without_dependencies_again_only_when_changed(tmp_path: Path, wheelhouse: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _wheel(wheels, 1)
    # Without the toolkit's installer the role installs the lock with the venv's pip, the same options.
    first = _run(tmp_path, wheelhouse, [], sglang_venv_extra_wheels=[str(wheel)], sglang_venv_uv_src="")
    assert first.rc == 0, first.failures
    assert _installer(tmp_path) == "pip" and not (tmp_path / "tools").exists()
    assert _value(tmp_path) == "1"
    assert (tmp_path / "extra-wheels" / wheel.name).is_file()  # beside the wheelhouse, not in it
    assert not (tmp_path / "wheelhouse" / wheel.name).exists()
    # No local model path: the role fetches by default (here there is no repo id, so nothing to fetch).
    assert _ran(first, "Say why the model is not fetched") == ["skipped"]

    again = _run(tmp_path, wheelhouse, [], sglang_venv_extra_wheels=[str(wheel)])
    assert again.rc == 0, again.failures
    assert again.hosts["localhost"].changed == 0
    assert _ran(again, "Install the extra wheels whose file changed") == ["skipped"]

    _wheel(wheels, 2)  # the same file name, other contents (a rebuilt kernel keeps its version)
    changed = _run(tmp_path, wheelhouse, [], sglang_venv_extra_wheels=[str(wheel)],
                   sglang_venv_model_local_path="/models/local")
    assert changed.rc == 0, changed.failures
    assert _value(tmp_path) == "2"
    assert "changed" in _ran(changed, "Install the extra wheels whose file changed")
    assert _ran(changed, "Say why the model is not fetched") == ["ok"]  # a local path: nothing fetched


def test_an_extra_wheel_that_is_not_a_wheel_file_is_refused_before_any_change(tmp_path: Path,
                                                                               wheelhouse: Path) -> None:
    not_a_wheel = tmp_path / "kernel.whl"
    not_a_wheel.write_text("x")
    result = _run(tmp_path, wheelhouse, [], sglang_venv_extra_wheels=[str(tmp_path / "gone-1.0-py3-none-any.whl"),
                                                                      str(not_a_wheel)])
    assert result.rc != 0
    message = "\n".join(f.message for f in result.failures)
    assert "gone-1.0-py3-none-any.whl" in message and "kernel.whl" in message and "Nothing was changed" in message
    assert not (tmp_path / "venv").exists() and not (tmp_path / "wheelhouse").exists()
