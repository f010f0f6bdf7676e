"""The compatibility matrix: every row cites its source, and the lookups the plan relies on."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from toolkit.adapters.compat_store import DATA_DIR, read_matrix
from toolkit.core.errors import ToolkitError
from toolkit.core.hostplan.matrix import FILES, cuda_of_requirements, load_matrix


def _documents() -> dict[str, object]:
    return {name: yaml.safe_load((DATA_DIR / f"{name}.yaml").read_text()) for name in FILES}


def test_every_row_has_a_source() -> None:
    matrix = read_matrix()
    rows = matrix.rows()
    assert len(rows) >= 20
    for table, row in rows:
        assert row.source.strip(), f"{table}: {row} has no source"


@pytest.mark.parametrize("table", FILES)
def test_a_row_without_source_is_refused(table: str) -> None:
    docs = _documents()
    broken = dict(docs[table])  # type: ignore[call-overload]
    broken["rows"] = [{k: v for k, v in broken["rows"][0].items() if k != "source"}, *broken["rows"][1:]]
    with pytest.raises(ToolkitError) as err:
        load_matrix({**docs, table: broken})
    text = str(err.value)
    assert f"{table}.yaml: rows[0]: missing ['source']" in text and "cite the upstream" in text


def test_driver_kernel_lookups() -> None:
    m = read_matrix()
    status, row = m.kernel_build("580.95.05", "7.0")
    assert status == "too-old" and row is not None and row.first_release == "580.142"
    assert m.kernel_build("580.142", "7.0")[0] == "ok"
    assert m.kernel_build("580.142", "7.1")[0] == "too-old"
    assert m.kernel_build("580.159.04", "7.1")[0] == "ok"
    assert m.kernel_build("580.95.05", "6.17")[0] == "ok"
    assert m.kernel_build("580.159.04", "7.2")[0] == "unknown"
    assert m.kernel_build("595.10", "6.8")[0] == "unknown"


def test_arch_fabricmanager_debian() -> None:
    m = read_matrix()
    arch = m.arch_of("GP102GL")
    assert arch is not None and arch.arch == "pascal" and arch.last_branch == "580"
    blackwell = m.arch_of("GB202")
    assert blackwell is not None and blackwell.modules == ("open",)
    fm = m.fabricmanager_of("580.142")
    assert fm is not None and fm.package == "nvidia-fabricmanager" and fm.virtual == "nvidia-fabricmanager-580"
    old = m.fabricmanager_of("570.195.03")
    assert old is not None and old.package == "nvidia-fabricmanager-570"
    deb = m.debian_of("9.2.0")
    assert deb is not None and deb.debian_suite == "trixie" and deb.cuda_repo == "debian13"


def test_sglang_cuda_generated_from_requirements(tmp_path: Path) -> None:
    cited = read_matrix().sglang_cuda
    lock = "# sglang: 0.5.9\nnvidia-cublas-cu12==12.8.4.1 \\\nnvidia-cuda-runtime-cu12==12.8.90 \\\n"
    row = cuda_of_requirements(lock, "profiles/requirements/sglang-0.5.9-cp311.lock", cited)
    assert row is not None and (row.sglang, row.cuda) == ("0.5.9", "12.8") and "generated" in row.source
    txt = "sglang==0.5.23\nflashinfer_python[cu13]==0.7.2\n"
    row = cuda_of_requirements(txt, "x.txt", cited)
    assert row is not None and row.cuda == "13.0"
    assert cuda_of_requirements("sglang==0.5.1\ntorch==2.9\n", "y.txt", cited) is None
    (tmp_path / "sglang-0.5.9-cp311.lock").write_text(lock)
    m = read_matrix(requirements_dir=tmp_path)
    got = m.cuda_of_sglang("0.5.9")
    assert got is not None and got.cuda == "12.8" and got.source.startswith("profiles/requirements/sglang-0.5.9")
    min_driver = m.min_driver("13.0")
    assert min_driver is not None and min_driver.min_driver == "580.65.06"


def test_docs_table_is_current() -> None:
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, str(repo / "scripts" / "compat_matrix_doc.py"), "--check"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
