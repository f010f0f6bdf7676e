from __future__ import annotations

from pathlib import Path

import pytest

from tests.profile.hostile_cases import link_locks
from toolkit.adapters.profile_store import ProfileStore

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SHIPPED = REPO / "profiles"
BROKEN = HERE / "broken"
GOLDEN = HERE / "golden"


@pytest.fixture
def shipped() -> ProfileStore:
    return ProfileStore(SHIPPED)


@pytest.fixture
def write_profiles(tmp_path: Path):
    """Write {name: yaml text} into a fresh profiles dir and return its store."""

    def make(files: dict[str, str]) -> ProfileStore:
        # The shipped engine locks where the store looks: a profile on a release without one is refused.
        link_locks(tmp_path)
        for name, text in files.items():
            (tmp_path / f"{name}.yaml").write_text(text, encoding="utf-8")
        return ProfileStore(tmp_path)

    return make


BASE_YAML = """\
schema_version: 1
name: base
target:
  gpu_model: NVIDIA RTX PRO 6000 Blackwell
  gpu_count: 8
  compute_capability: SM120
  interconnect: pcie
  p2p: false
engine:
  sglang_version: 0.5.9
model:
  repo_id: lukealonso/GLM-5-NVFP4
  served_model_name: glm-5
  architecture: GlmMoeDsaForCausalLM
server:
  tp_size: 8
  nsa_decode_backend: trtllm
  cuda_graph: false
  radix_cache: false
  extra_args: [--enable-cache-report]
env:
  NCCL_DEBUG: WARN
"""


@pytest.fixture
def base_yaml() -> str:
    """A valid SM120 GLM-5 profile named `base` (no errors, no warnings from the NSA rules)."""
    return BASE_YAML
