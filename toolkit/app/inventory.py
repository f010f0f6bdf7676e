"""Write the user's inventory: `toolkit inventory add` (core/inventory.py makes the document; one atomic write)."""

from __future__ import annotations

from pathlib import Path

import yaml

from toolkit.adapters.files import write_atomic
from toolkit.core.errors import ToolkitError
from toolkit.core.inventory import HEADER, NewHost, add_host, container_name

DEFAULT_FILE = Path("inventory/hosts.yml")


def add(new: NewHost, file: Path | None = None) -> tuple[Path, list[str]]:
    """(the file written, the inventory names added)."""
    path = file or DEFAULT_FILE
    doc = None
    if path.exists():
        try:
            doc = yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            raise ToolkitError.of(f"not a YAML inventory: {err}", file=str(path), field="-i",
                                  fix="name a YAML inventory, or a new file") from None
        if doc is not None and not isinstance(doc, dict):
            raise ToolkitError.of("not a YAML inventory (no mapping at the top)", file=str(path), field="-i",
                                  fix="name a YAML inventory, or a new file")
    out = add_host(doc, new, file=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(out, sort_keys=False, default_flow_style=False, width=120)
    write_atomic(path, (HEADER if doc is None else "") + text)
    return path, [new.name] + ([container_name(new)] if new.vmid is not None else [])
