"""Extension points: what an overlay (the built-in lab, or a site's own package) plugs into the use cases.

An overlay registers Python entry points (pyproject.toml's `[project.entry-points."toolkit.<group>"]`), the
standard seam by which one installed package adds to another without either importing the other. The use cases
look a plug-in up by the name an input gives (an inventory's `toolkit_overlay`, `--runner NAME`,
`--gpu-source NAME:ARG`) and never import an overlay's code themselves.

Groups:
- toolkit.deploy_overlays: a callable (OverlayContext) -> Amendment for `toolkit apply` (toolkit.app.apply)
- toolkit.runners: a callable (RunnerContext) -> point runner for sweeps and tunes (toolkit.app.measure)
- toolkit.gpu_sources: a callable (ARG) -> GPU sampler for `toolkit probe run` (toolkit.app.probe)
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from toolkit.core.errors import ToolkitError

GROUPS = {
    "deploy_overlays": "toolkit.deploy_overlays",
    "runners": "toolkit.runners",
    "gpu_sources": "toolkit.gpu_sources",
}


def names(group: str) -> list[str]:
    """The plug-ins installed for `group` (a key of GROUPS)."""
    return sorted(ep.name for ep in entry_points(group=GROUPS[group]))


def load(group: str, name: str, *, field: str, fix: str) -> Any:
    """The plug-in `name` of `group`. A name nobody registered is bad input (exit 2, naming `field` and the
    installed names); a plug-in that fails to import raises its own error: a broken overlay fails loudly."""
    found = [ep for ep in entry_points(group=GROUPS[group]) if ep.name == name]
    if not found:
        known = ", ".join(names(group)) or "none installed"
        raise ToolkitError.of(f"no {group.replace('_', ' ')[:-1]} named {name!r} (installed: {known})",
                              field=field, fix=fix)
    return found[0].load()
