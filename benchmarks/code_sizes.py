"""Module and function sizes of a tree's Python package, for a closing note's before and after.

Counts lines, not statements: a module is its file's lines, a function its span in the file (`ast`: from its
`def` to its last line, decorators left out, nested functions counted inside their parent and again alone).

    .venv/bin/python benchmarks/code_sizes.py [--root toolkit] [--rev REV]

With --rev the package is read as git holds it at REV (nothing is checked out), so a note can give `--rev c6ecbdb`
beside the working tree's figures from one command.
"""

from __future__ import annotations

import argparse
import ast
import statistics
import subprocess
from collections.abc import Iterator
from pathlib import Path


def sources(root: str, rev: str | None) -> Iterator[tuple[str, str]]:
    """(path, text) of every .py file under `root`, in the working tree or at git revision `rev`."""
    if rev is None:
        for path in sorted(Path(root).rglob("*.py")):
            yield str(path), path.read_text()
        return
    listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "--", root], capture_output=True,
                            text=True, check=True).stdout.split()
    for name in sorted(n for n in listed if n.endswith(".py")):
        yield name, subprocess.run(["git", "show", f"{rev}:{name}"], capture_output=True, text=True,
                                   check=True).stdout


def sizes(files: Iterator[tuple[str, str]]) -> tuple[dict[str, int], dict[str, int]]:
    modules: dict[str, int] = {}
    functions: dict[str, int] = {}
    for path, text in files:
        modules[path] = len(text.splitlines())
        for node in ast.walk(ast.parse(text, path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                functions[f"{path}:{node.lineno}:{node.name}"] = (node.end_lineno or node.lineno) - node.lineno + 1
    return modules, functions


def describe(name: str, values: dict[str, int], over: int) -> str:
    v = sorted(values.values())
    biggest = max(values, key=lambda k: values[k])
    return (f"{name}: {len(v)}, lines total {sum(v)}, mean {statistics.mean(v):.1f}, median {statistics.median(v):g}, "
            f"p90 {v[int(0.9 * (len(v) - 1))]}, max {v[-1]} ({biggest}), over {over} lines: "
            f"{sum(x > over for x in v)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="toolkit")
    ap.add_argument("--rev", default=None, help="a git revision (default: the working tree)")
    args = ap.parse_args()
    modules, functions = sizes(sources(args.root, args.rev))
    print(f"{args.root} at {args.rev or 'the working tree'}")
    print(describe("modules", modules, 400))
    print(describe("functions", functions, 50))


if __name__ == "__main__":
    main()
