"""Regenerate SGLang's flag catalogue for a release (`toolkit profile catalogue`): read from the release's own wheel
(downloaded, no dependencies, cached) or from the SGLang installed here, checked, and stored where validation and
rendering read it (toolkit/data/sglang_flags/VERSION.json, or another folder)."""

from __future__ import annotations

from pathlib import Path

from toolkit.adapters import sglang_catalogue
from toolkit.core.profile.catalogue import Catalogue


def regenerate(sglang_version: str | None, *, from_installed: bool = False, wheel: Path | None = None,
               out_dir: Path | None = None) -> tuple[Path, Catalogue]:
    """(the file written, the catalogue). An extraction that lacks the core flags or finds implausibly few is
    refused (ToolkitError, exit 2) and nothing is written."""
    out = out_dir or sglang_catalogue.DATA_DIR
    if from_installed:
        return sglang_catalogue.store(sglang_catalogue.from_installed(), out)
    if not sglang_version:
        raise ValueError("a release, or from_installed")
    return sglang_catalogue.regenerate(sglang_version, wheel=wheel, out_dir=out)
