"""The compatibility matrix: which driver builds on which kernel, which modules drive which GPU, what CUDA an
SGLang release needs and which driver runs it, Fabric Manager per branch, PVE major and Debian suite.

Data in toolkit/data/compat/*.yaml, each row with its `source` (the upstream file, release note or thread);
`load_matrix` validates the documents (pure: the caller reads the files) and refuses a row without a source.
The SGLang -> CUDA rows are generated from the repository's requirements files where they pin CUDA wheels
(`cuda_of_requirements`), and fall back to the cited rows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.hostplan.facts import version_key

MATRIX_SCHEMA = 1
FILES = ("driver_kernel", "gpu_arch", "cuda_driver", "sglang_cuda", "fabricmanager", "pve_debian", "driver_pick")


@dataclass(frozen=True)
class DriverKernel:
    branch: str
    kernel_series: str
    first_release: str
    last_failing: str | None
    source: str


@dataclass(frozen=True)
class GpuArch:
    arch: str
    chip_prefix: str
    gsp: bool
    modules: tuple[str, ...]
    last_branch: str | None
    first_branch: str | None
    source: str


@dataclass(frozen=True)
class CudaDriver:
    cuda_major: str
    min_driver: str
    source: str


@dataclass(frozen=True)
class SglangCuda:
    sglang: str  # a release range: ">=0.5.20", "<0.5.20", or one release "0.5.23"
    cuda: str  # MAJOR.MINOR
    source: str


@dataclass(frozen=True)
class FabricManager:
    branches: str
    package: str  # may hold {branch}
    virtual: str | None
    files: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class PveDebian:
    pve_major: str
    debian_suite: str
    cuda_repo: str
    source: str


@dataclass(frozen=True)
class DriverPick:
    release: str
    source: str


@dataclass(frozen=True)
class Matrix:
    driver_kernel: tuple[DriverKernel, ...]
    gpu_arch: tuple[GpuArch, ...]
    cuda_driver: tuple[CudaDriver, ...]
    sglang_cuda: tuple[SglangCuda, ...]
    fabricmanager: tuple[FabricManager, ...]
    pve_debian: tuple[PveDebian, ...]
    driver_pick: tuple[DriverPick, ...]

    def rows(self) -> list[tuple[str, Any]]:
        """Every row with its table's name, for the docs' table and the no-source test."""
        return [(name, row) for name in FILES for row in getattr(self, name)]

    # ---------------------------------------------------------------- lookups

    def arch_of(self, chip: str | None) -> GpuArch | None:
        if not chip:
            return None
        return next((a for a in self.gpu_arch if chip.startswith(a.chip_prefix)), None)

    def kernel_build(self, release: str, series: str) -> tuple[str, DriverKernel | None]:
        """("ok" | "too-old" | "unknown", the row that decided). Rows are per branch; a series older than every
        row's builds with the whole branch; one newer than every row is unknown."""
        branch = branch_of(release)
        rows = sorted((r for r in self.driver_kernel if r.branch == branch), key=lambda r: version_key(r.kernel_series))
        exact = next((r for r in rows if r.kernel_series == series), None)
        if exact is not None:
            return ("ok" if version_key(release) >= version_key(exact.first_release) else "too-old"), exact
        if rows and version_key(series) < version_key(rows[0].kernel_series):
            return "ok", None
        if rows and version_key(series) > version_key(rows[-1].kernel_series):
            return "unknown", rows[-1]
        if rows:  # between two rows: the nearer older row's release builds it (a row marks where builds broke)
            older = [r for r in rows if version_key(r.kernel_series) < version_key(series)][-1]
            return ("ok" if version_key(release) >= version_key(older.first_release) else "too-old"), older
        return "unknown", None

    def first_building(self, series: str, branch: str) -> DriverKernel | None:
        return next((r for r in self.driver_kernel if r.branch == branch and r.kernel_series == series), None)

    def min_driver(self, cuda: str) -> CudaDriver | None:
        major = cuda.split(".")[0]
        return next((r for r in self.cuda_driver if r.cuda_major == major), None)

    def cuda_of_sglang(self, version: str | None) -> SglangCuda | None:
        if not version:
            return None
        for row in self.sglang_cuda:  # exact (generated) rows first: they are listed first
            if row.sglang == version:
                return row
        for row in self.sglang_cuda:
            if _in_range(version, row.sglang):
                return row
        return None

    def fabricmanager_of(self, release: str) -> FabricManager | None:
        branch = branch_of(release)
        for row in self.fabricmanager:
            if _in_range(branch, row.branches):
                return FabricManager(row.branches, row.package.format(branch=branch),
                                     row.virtual.format(branch=branch) if row.virtual else None, row.files, row.source)
        return None

    def debian_of(self, pve_version: str | None) -> PveDebian | None:
        if not pve_version:
            return None
        major = pve_version.split(".")[0]
        return next((r for r in self.pve_debian if r.pve_major == major), None)


def branch_of(release: str) -> str:
    return release.split(".")[0]


def _in_range(version: str, bounds: str) -> bool:
    for bound in bounds.split(","):
        bound = bound.strip()
        if bound[:2] in (">=", "<=", "=="):
            op, edge = bound[:2], bound[2:]
        elif bound[:1] in ("<", ">"):
            op, edge = bound[:1], bound[1:]
        else:
            op, edge = "==", bound
        have, want = version_key(version), version_key(edge)
        ok = {">=": have >= want, "<=": have <= want, "==": have == want, ">": have > want, "<": have < want}[op]
        if not ok:
            return False
    return True


# ---------------------------------------------------------------- loading


_FIELDS: dict[str, tuple[type, tuple[str, ...], tuple[str, ...]]] = {
    # table: (row type, required fields, optional fields)
    "driver_kernel": (DriverKernel, ("branch", "kernel_series", "first_release", "source"), ("last_failing",)),
    "gpu_arch": (GpuArch, ("arch", "chip_prefix", "gsp", "modules", "source"), ("last_branch", "first_branch")),
    "cuda_driver": (CudaDriver, ("cuda_major", "min_driver", "source"), ()),
    "sglang_cuda": (SglangCuda, ("sglang", "cuda", "source"), ()),
    "fabricmanager": (FabricManager, ("branches", "package", "files", "source"), ("virtual",)),
    "pve_debian": (PveDebian, ("pve_major", "debian_suite", "cuda_repo", "source"), ()),
    "driver_pick": (DriverPick, ("release", "source"), ()),
}


def load_matrix(documents: Mapping[str, Any], where: Mapping[str, str] | None = None,
                generated: tuple[SglangCuda, ...] = ()) -> Matrix:
    """The matrix from its parsed YAML documents by table name; `where` names each table's file for errors.
    `generated` SGLang rows (from requirements files) go before the cited ones. Refuses a row without a source,
    a missing or unknown field, or a table of another schema."""
    problems: list[Problem] = []
    tables: dict[str, tuple[Any, ...]] = {}
    for name, (cls, required, optional) in _FIELDS.items():
        file = (where or {}).get(name, f"toolkit/data/compat/{name}.yaml")
        doc = documents.get(name)
        if not isinstance(doc, Mapping) or not isinstance(doc.get("rows"), list):
            problems.append(Problem("no rows: the table is missing or not a mapping with `rows:`", file=file,
                                    fix="restore the file from git"))
            continue
        if doc.get("schema") != MATRIX_SCHEMA:
            problems.append(Problem(f"schema {doc.get('schema')!r}, this toolkit reads {MATRIX_SCHEMA}", file=file,
                                    field="schema", fix="update the toolkit, or restore the file from git"))
            continue
        rows = []
        for i, row in enumerate(doc["rows"]):
            at = f"rows[{i}]"
            if not isinstance(row, Mapping):
                problems.append(Problem("a row must be a mapping", file=file, field=at))
                continue
            unknown = sorted(set(row) - set(required) - set(optional) - {"note"})
            missing = [k for k in required if row.get(k) in (None, "", [])]
            if unknown:
                problems.append(Problem(f"unknown field(s) {unknown}", file=file, field=at,
                                        fix=f"use only {sorted((*required, *optional, 'note'))}"))
            if missing:
                fix = ("cite the upstream file, release note or thread the row rests on" if "source" in missing
                       else f"add {missing}")
                problems.append(Problem(f"missing {missing}", file=file, field=at, fix=fix))
            if unknown or missing:
                continue
            values = {k: row.get(k) for k in (*required, *optional)}
            values = {k: (tuple(str(x) for x in v) if isinstance(v, list) else
                          v if isinstance(v, bool) or v is None else str(v).strip()) for k, v in values.items()}
            rows.append(cls(**values))
        tables[name] = tuple(rows)
    if problems:
        raise ToolkitError(problems)
    return Matrix(
        driver_kernel=tables["driver_kernel"], gpu_arch=tables["gpu_arch"], cuda_driver=tables["cuda_driver"],
        sglang_cuda=(*generated, *tables["sglang_cuda"]), fabricmanager=tables["fabricmanager"],
        pve_debian=tables["pve_debian"], driver_pick=tables["driver_pick"])


_CU = re.compile(r"(?:\[|-)cu(1\d)\b")
_RUNTIME = re.compile(r"^nvidia-cuda-runtime-cu1\d==(\d+)\.(\d+)", re.M)
_SGLANG = re.compile(r"^(?:#\s*sglang:\s*|sglang==)(\d[\w.]*)", re.M)


def cuda_of_requirements(text: str, path: str, fallback: tuple[SglangCuda, ...]) -> SglangCuda | None:
    """An SGLang release's CUDA from its requirements or lock file: the major from the CUDA wheels' pins
    (`-cu12`/`[cu13]`), the minor from nvidia-cuda-runtime's pin when the file has one, else the cited row's."""
    release = _SGLANG.search(text)
    majors = {m.group(1) for m in _CU.finditer(text)}
    if not release or len(majors) != 1:
        return None
    major = majors.pop()
    runtime = _RUNTIME.search(text)
    version = release.group(1)
    if runtime and runtime.group(1) == major:
        cuda = f"{runtime.group(1)}.{runtime.group(2)}"
        why = f"nvidia-cuda-runtime-cu{major}=={runtime.group(1)}.{runtime.group(2)}"
    else:
        cited = next((r for r in fallback if _in_range(version, r.sglang) and r.cuda.split(".")[0] == major), None)
        cuda = cited.cuda if cited else f"{major}.0"
        why = f"CUDA wheels pinned -cu{major}/[cu{major}]"
    return SglangCuda(version, cuda, f"{path} ({why}; generated)")


def matrix_table(matrix: Matrix) -> list[str]:
    """Every row with its source, as docs/provision.md shows it (scripts/compat_matrix_doc.py writes it there)."""
    from toolkit.core.tables import markdown_table

    def row_text(table: str, r: Any) -> str:
        if table == "driver_kernel":
            return f"driver {r.branch} on kernel {r.kernel_series}: {r.first_release}+ (fails: {r.last_failing or '-'})"
        if table == "gpu_arch":
            return (f"{r.arch} ({r.chip_prefix}*): {'/'.join(r.modules)} modules"
                    + (f", last branch {r.last_branch}" if r.last_branch else "")
                    + (f", from branch {r.first_branch}" if r.first_branch else ""))
        if table == "cuda_driver":
            return f"CUDA {r.cuda_major}: driver {r.min_driver}+"
        if table == "sglang_cuda":
            return f"SGLang {r.sglang}: CUDA {r.cuda}"
        if table == "fabricmanager":
            return (f"branch {r.branches}: `{r.package}`" + (f" (`{r.virtual}` only virtual)" if r.virtual else "")
                    + f"; {', '.join(r.files)}")
        if table == "pve_debian":
            return f"PVE {r.pve_major}: Debian {r.debian_suite}, CUDA repository {r.cuda_repo}"
        return f"unpinned pick: {r.release}"

    return markdown_table(["table", "row", "source"], [(t, row_text(t, r), r.source) for t, r in matrix.rows()])
