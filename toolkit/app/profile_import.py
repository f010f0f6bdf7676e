"""Write a profile from an SGLang server that already runs: `toolkit profile import --server-url URL NAME`.

The server's /server_info (its resolved arguments and version) and, where given, its command line become a new
profile file (core/profile/importer.py), checked as every profile is. An existing file is never replaced.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from toolkit.adapters import sglang_metrics
from toolkit.adapters.files import write_atomic
from toolkit.adapters.sglang_catalogue import load_catalogue
from toolkit.app.profiles import check_profiles, open_store
from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.profile.importer import profile_from_server, server_args_of


@dataclass(frozen=True)
class ImportOutcome:
    file: Path
    knobs: dict[str, object]
    notes: list[str]
    problems: list[Problem]


def import_profile(server_url: str, name: str, *, profiles_dir: str | None = None, command: Sequence[str] = (),
                   sglang_version: str | None = None, target: dict[str, object] | None = None) -> ImportOutcome:
    store = open_store(profiles_dir)
    path = store.path(name)
    if path.exists():
        raise ToolkitError.of(f"{path} exists: import writes a new profile only", field="NAME",
                              fix=f"give another name, or remove {path} first")
    info = sglang_metrics.server_info(server_url)
    version = sglang_version or str(info.get("version") or "")
    catalogue = load_catalogue(version) if version else None
    imported = profile_from_server(info, name=name, source=server_url.rstrip("/"),
                                   date=time.strftime("%Y-%m-%d", time.gmtime()), version=sglang_version,
                                   catalogue=catalogue, command=command,
                                   target=dict(target or {}))
    notes = list(imported.notes)
    if catalogue is None and version:
        notes.append(f"no flag catalogue for SGLang {version}: every knob the server reports is written, defaults "
                     "included, and its flags are not checked")
    if "model_path" not in server_args_of(info):
        notes.append("the server does not report its model_path: model: is left out")
    write_atomic(path, imported.text)
    problems = check_profiles(store, [name])[name]
    return ImportOutcome(path, imported.knobs, notes, problems)
