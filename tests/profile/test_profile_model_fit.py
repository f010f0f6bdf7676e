"""The parallel layout against the model's own config (model.config, pinned in the shipped GLM-5 profiles from
GLM-5's config.json): tp divides the attention heads and splits the KV heads evenly, ep divides the routed
experts, pp the layers. Each misfit is an error at the knob that breaks it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from toolkit.adapters.profile_store import ProfileStore
from toolkit.app.profiles import check

SHIPPED = Path(__file__).resolve().parents[2] / "profiles"


def _variant(tmp_path: Path, body: str) -> list:
    shutil.copytree(SHIPPED, tmp_path / "profiles")
    (tmp_path / "profiles" / "v.yaml").write_text(f"schema_version: 1\nname: v\nextends: glm5-tp8\n{body}")
    problems = check(ProfileStore(tmp_path / "profiles").resolve("v"))
    return [p for p in problems if p.rule_id == "layout-fits-model"]


def test_the_shipped_profiles_pin_glm5s_config_and_fit_it() -> None:
    store = ProfileStore(SHIPPED)
    for name in store.names():
        resolved = store.resolve(name)
        config = resolved.spec.model.config
        assert (config.num_attention_heads, config.num_key_value_heads, config.num_hidden_layers,
                config.experts) == (64, 64, 78, 256)
        assert not [p for p in check(resolved) if p.rule_id == "layout-fits-model"], name


@pytest.mark.parametrize(("body", "field", "says"), [
    ("target:\n  gpu_count: 3\nserver:\n  tp_size: 3\n", "server.tp_size", "does not divide the model's 64 attention"),
    ("server:\n  tp_size: 8\n  ep_size: 8\nmodel:\n  config:\n    n_routed_experts: 100\n", "server.ep_size",
     "100 routed experts"),
    ("server:\n  tp_size: 4\n  pp_size: 2\nmodel:\n  config:\n    num_hidden_layers: 77\n", "server.pp_size",
     "77 layers"),
    ("server:\n  tp_size: 8\nmodel:\n  config:\n    num_attention_heads: 96\n    num_key_value_heads: 12\n",
     "server.tp_size", "12 KV heads"),
])
def test_a_layout_that_does_not_fit_the_model_is_an_error(tmp_path: Path, body: str, field: str, says: str) -> None:
    (problem,) = _variant(tmp_path, body)
    assert problem.severity == "error" and problem.field == field and says in problem.message
    assert problem.fix and "e.g." in problem.fix


def test_kv_heads_replicated_over_ranks_fit(tmp_path: Path) -> None:
    """tp 8 over 4 KV heads: each KV head on 2 ranks, as SGLang replicates them."""
    assert _variant(tmp_path, "model:\n  config:\n    num_attention_heads: 32\n    num_key_value_heads: 4\n") == []
