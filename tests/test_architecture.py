"""The contracts of docs/architecture.md that lint-imports cannot see: the core does no I/O (an import contract sees
modules, not a call to open() or Path.read_text()), and every command module is in the "A command imports no other
command" contract of pyproject.toml."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "toolkit" / "core"

# Modules whose only use is I/O: files, processes, the network, the environment.
IO_MODULES = {"os", "subprocess", "socket", "http", "urllib", "shutil", "tempfile", "fcntl", "glob", "select",
              "ssl", "signal", "requests", "multiprocessing"}
IO_BUILTINS = {"open", "input", "print", "breakpoint"}
# pathlib's methods that touch the file system (a Path is pure until one of these is called).
IO_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "is_file", "is_dir", "exists", "mkdir",
              "iterdir", "glob", "rglob", "stat", "lstat", "unlink", "touch", "rmdir", "chmod", "is_symlink",
              "readlink", "samefile", "expanduser", "home", "cwd", "hardlink_to", "symlink_to"}


def io_in_core(core: Path = CORE) -> list[str]:
    found = []
    for path in sorted(core.rglob("*.py")):
        where = path.relative_to(core.parent.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [f"{where}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in IO_MODULES]
            elif isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Name) and f.id in IO_BUILTINS:
                    found.append(f"{where}:{node.lineno} calls {f.id}()")
                elif isinstance(f, ast.Attribute) and f.attr in IO_METHODS:
                    found.append(f"{where}:{node.lineno} calls .{f.attr}()")
    return found


def test_the_core_does_no_io() -> None:
    assert io_in_core() == []


def test_the_core_check_finds_io(tmp_path: Path) -> None:
    """The check can fail: each kind of I/O in a core module is found."""
    core = tmp_path / "toolkit" / "core"
    core.mkdir(parents=True)
    (core / "leak.py").write_text("import subprocess\nfrom os import environ\n\n\ndef f(p):\n"
                                  "    open(p)\n    return p.read_text(), p.is_file()\n")
    assert io_in_core(core) == [
        "toolkit/core/leak.py:1 imports subprocess", "toolkit/core/leak.py:2 imports os",
        "toolkit/core/leak.py:6 calls open()", "toolkit/core/leak.py:7 calls .read_text()",
        "toolkit/core/leak.py:7 calls .is_file()"]


def test_every_command_module_is_in_the_independence_contract() -> None:
    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (independence,) = [c for c in contracts if c["type"] == "independence"]
    commands = {f"toolkit.cli.{p.stem}" for p in (REPO / "toolkit" / "cli").glob("*_cmd.py")}
    assert set(independence["modules"]) == commands
