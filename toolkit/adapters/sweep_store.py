"""Sweeps on disk: one directory per sweep run, its state file written atomically after every point.

    runs/sweeps/<run id>/
        state.json          the resumable state (toolkit.core.sweep.state), schema-versioned
        variants/vNN/cC/    the probe artifacts of variant NN at concurrency C (apply runner)
        profiles/           the variant profiles the apply runner deployed (extends: the base)
        report.md, *.png    the ranking and the plots, rewritten at the end of each invocation

A tune keeps its runs in the same layout under runs/tunes/. The runners that fill them are toolkit.app.measure's.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from toolkit.adapters.files import write_atomic
from toolkit.core.errors import ToolkitError
from toolkit.core.sweep.state import SweepState, state_from_dict

SWEEPS_ENV = "TOOLKIT_SWEEPS_DIR"
DEFAULT_SWEEPS_DIR = "runs/sweeps"
TUNES_ENV = "TOOLKIT_TUNES_DIR"
DEFAULT_TUNES_DIR = "runs/tunes"
STATE_FILE = "state.json"
_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


def sweeps_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get(SWEEPS_ENV) or DEFAULT_SWEEPS_DIR).expanduser().resolve()


def tunes_dir(explicit: str | None = None) -> Path:
    return Path(explicit or os.environ.get(TUNES_ENV) or DEFAULT_TUNES_DIR).expanduser().resolve()


class SweepStore:
    """`kind` and `dir_flag` name the runs in messages: a tune keeps its runs in the same layout (runs/tunes/)."""

    def __init__(self, root: str | Path, *, kind: str = "sweep", dir_flag: str = "--sweeps-dir") -> None:
        self.root = Path(root)
        self.kind = kind
        self.dir_flag = dir_flag

    def run_dir(self, run_id: str) -> Path:
        if not _RUN_ID.match(run_id):
            raise ToolkitError.of(
                f"{run_id!r} is not a {self.kind} run id", field="--resume", fix=f"see `ls {self.root}`"
            )
        return self.root / run_id

    def state_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / STATE_FILE

    def runs(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if (p / STATE_FILE).is_file())

    def new_run_id(self, profile: str, now: float | None = None) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now if now is not None else time.time()))
        run_id = f"{profile}-{stamp}"
        n = 2
        while self.run_dir(run_id).exists():
            run_id = f"{profile}-{stamp}-{n}"
            n += 1
        return run_id

    def create(self, state: SweepState) -> Path:
        d = self.run_dir(state.run_id)
        d.mkdir(parents=True, exist_ok=False)
        self.save(state)
        return d

    def save(self, state: SweepState) -> None:
        """Atomic (temp file, fsync, os.replace): a kill at any moment leaves the previous state or this one."""
        text = json.dumps(state.to_dict(), indent=1, ensure_ascii=False) + "\n"
        write_atomic(self.state_path(state.run_id), text)

    def load(self, run_id: str) -> SweepState:
        path = self.state_path(run_id)
        if not path.is_file():
            known = ", ".join(self.runs()[-5:]) or "none"
            raise ToolkitError.of(
                f"no {self.kind} {run_id!r} in {self.root}",
                file=str(path),
                field="--resume",
                fix=f"give one of: {known} (or {self.dir_flag} DIR)",
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ToolkitError.of(
                f"not valid JSON: {err.msg}", file=str(path), line=err.lineno, fix="restore it or start a new sweep"
            ) from None
        return state_from_dict(data, file=str(path))

    def write_text(self, run_id: str, name: str, text: str) -> Path:
        path = self.run_dir(run_id) / name
        write_atomic(path, text)
        return path


def load_table(path: str | Path) -> dict[str, Any]:
    """A recorded results table (JSON or YAML) for the in-process runner."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        msg = f"cannot read: {err.strerror}"
        raise ToolkitError.of(msg, file=str(p), field="--runner", fix="give a table file") from None
    try:
        if p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except ValueError as err:  # json.JSONDecodeError and yaml.YAMLError are both ValueErrors or close to it
        raise ToolkitError.of(f"not a valid table: {err}", file=str(p), fix="check the file") from None
    if not isinstance(data, dict):
        raise ToolkitError.of("a recorded table must be a mapping", file=str(p), fix="{about: ..., points: [...]}")
    return data
