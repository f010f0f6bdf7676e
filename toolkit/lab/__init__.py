"""The lab: local test hosts that stand in for a Proxmox GPU host (`pve1`) and its container.

The Python API the tests and the other commands use (the lab <-> roles contract in docs/lab.md):

    state = toolkit.lab.up(gpus=8)        # idempotent; a warm cache makes it take seconds
    state.ssh("pve1", "pct list")         # CompletedProcess, over real SSH with the lab's key
    state.inventory_path                  # inventory/lab.yml: proxmox_hosts (pve1), gpu_containers (ct)
    toolkit.lab.down()                    # removes exactly what up made; the cache stays

`plan` is pure (addresses, inventory, files); `rootfs` and `system` do the system work.

Nothing is imported here at module level: the stand-in server (toolkit.lab.standin_server) runs inside the lab's
container from the toolkit's wheel, with the engine venv's packages only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolkit.lab.plan import LabConfig, LabState

Progress = Callable[[str], None]

__all__ = ["LabConfig", "LabState", "down", "status", "up"]


def __getattr__(name: str) -> Any:
    if name in ("LabConfig", "LabState"):
        from toolkit.lab import plan

        return getattr(plan, name)
    raise AttributeError(name)


def _quiet(_: str) -> None:
    return None


def up(gpus: int = 8, *, config: LabConfig | None = None, progress: Progress = _quiet) -> LabState:
    """Bring the lab up (or check that it is up) and return its state."""
    from toolkit.lab import system
    from toolkit.lab.plan import LabConfig

    return system.up(config or LabConfig(gpus=gpus), progress=progress)


def down(purge_cache: bool = False, *, progress: Progress = _quiet) -> None:
    """Remove what `up` made; with purge_cache also the cached userland and the lab's SSH key."""
    from toolkit.lab import system

    system.down(purge_cache=purge_cache, progress=progress)


def status() -> LabState | None:
    """The lab's state (None when it was never brought up); `.running` says whether pve1 runs."""
    from toolkit.lab import system

    return system.status()
