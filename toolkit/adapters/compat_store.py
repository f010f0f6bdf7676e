"""The compatibility matrix's files: toolkit/data/compat/*.yaml, and the SGLang requirements/lock files whose
CUDA wheel pins generate the SGLang -> CUDA rows. Reads only; toolkit.core.hostplan.matrix validates."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from toolkit.core.errors import ToolkitError
from toolkit.core.hostplan.matrix import FILES, Matrix, SglangCuda, cuda_of_requirements, load_matrix

DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "compat"


def _requirements_dir() -> Path:
    here = Path(__file__).resolve().parent.parent
    packaged = here / "_share" / "profiles" / "requirements"
    return packaged if packaged.is_dir() else here.parent / "profiles" / "requirements"


@lru_cache(maxsize=1)
def read_matrix(data_dir: Path = DATA_DIR, requirements_dir: Path | None = None) -> Matrix:
    documents: dict[str, Any] = {}
    where: dict[str, str] = {}
    for name in FILES:
        path = data_dir / f"{name}.yaml"
        where[name] = str(path)
        try:
            documents[name] = yaml.safe_load(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            documents[name] = None
        except yaml.YAMLError as exc:
            raise ToolkitError.of(f"not YAML: {exc}", file=str(path), fix="restore the file from git") from exc
    cited = load_matrix(documents, where).sglang_cuda
    generated: dict[str, SglangCuda] = {}
    req_dir = requirements_dir or _requirements_dir()
    # A lock (every package pinned, with the CUDA runtime) says more than a requirements file: read it last.
    files = sorted(req_dir.glob("sglang-*.txt")) + sorted(req_dir.glob("sglang-*.lock")) if req_dir.is_dir() else []
    for path in files:
        row = cuda_of_requirements(path.read_text(encoding="utf-8"), f"profiles/requirements/{path.name}", cited)
        if row is not None:
            generated[row.sglang] = row
    return load_matrix(documents, where, generated=tuple(generated[k] for k in sorted(generated)))
