"""Expanding --vary into variants: typed values, cartesian order, validation with the rule that rejected."""

from __future__ import annotations

from typing import Any

import pytest

from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.sweep.variants import Variant, changed_knobs, expand, parse_axes, parse_vary, plan, variant_spec

BASE: dict[str, Any] = {
    "name": "glm5-tp8",
    "server": {
        "tp": 8,
        "max_running_requests": 1024,
        "cuda_graph": False,
        "attention_backend": "flashinfer",
        "mem_fraction_static": 0.88,
    },
    "env": {"NCCL_ALGO": "Ring"},
    "bench": {"num_prompts": 1024},
}


def test_values_take_the_base_type() -> None:
    mrr = parse_vary("server.max_running_requests=256,512,1024", BASE)
    assert mrr.values == (256, 512, 1024)
    assert all(type(v) is int for v in mrr.values)
    cg = parse_vary("server.cuda_graph=on,off", BASE)
    assert cg.values == (True, False)
    # A string knob keeps "on" as text; it does not become a boolean.
    be = parse_vary("server.attention_backend=on,triton", BASE)
    assert be.values == ("on", "triton")


def test_value_without_base_is_inferred() -> None:
    axis = parse_vary("server.swa_full_tokens_ratio=0.85,0.9", BASE)
    assert axis.values == (0.85, 0.9)
    axis = parse_vary("server.chunked_prefill_size=-1,4096", BASE)
    assert axis.values == (-1, 4096)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("server.max_running_requests", "needs a path and values"),
        ("max_running_requests=1,2", "dotted path"),
        ("bench.num_prompts=10,20", "cannot be varied"),
        ("target.gpu_count=4,8", "cannot be varied"),
        ("server.max_running_requests=256,,512", "empty value"),
        ("server.max_running_requests=256,many", "int"),
        ("server.cuda_graph=on,maybe", "not a boolean"),
        ("server.max_running_requests=256,256", "listed twice"),
        ("server=1,2", "dotted path"),
        ("server.mem_fraction_static=nan,0.9", "finite"),
    ],
)
def test_bad_vary_is_a_toolkit_error(text: str, needle: str) -> None:
    with pytest.raises(ToolkitError) as err:
        parse_vary(text, BASE)
    rendered = str(err.value)
    assert needle in rendered
    assert "fix:" in rendered
    assert err.value.exit_code == 2


def test_same_path_twice_and_no_axes_are_errors() -> None:
    with pytest.raises(ToolkitError, match="varied twice"):
        parse_axes(["server.tp=4,8", "server.tp=2,4"], BASE)
    with pytest.raises(ToolkitError, match="at least one"):
        parse_axes([], BASE)


def test_expand_is_the_cartesian_product_first_axis_slowest() -> None:
    axes = parse_axes(["server.max_running_requests=256,512,1024", "server.cuda_graph=on,off"], BASE)
    variants = expand(axes)
    assert [v.id for v in variants] == ["v01", "v02", "v03", "v04", "v05", "v06"]
    assert [v.knob_dict() for v in variants[:3]] == [
        {"server.max_running_requests": 256, "server.cuda_graph": True},
        {"server.max_running_requests": 256, "server.cuda_graph": False},
        {"server.max_running_requests": 512, "server.cuda_graph": True},
    ]
    assert variants[1].label == "max_running_requests=256 cuda_graph=off"


def test_variant_spec_copies_and_changed_knobs() -> None:
    axes = parse_axes(["server.max_running_requests=512,1024", "env.NCCL_PROTO=LL"], BASE)
    v = expand(axes)[1]  # 1024 (the base's value) with a new env key
    spec = variant_spec(BASE, v)
    assert spec["server"]["max_running_requests"] == 1024
    assert spec["env"] == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
    assert "NCCL_PROTO" not in BASE["env"]  # the base is untouched
    assert changed_knobs(BASE, v) == {"env.NCCL_PROTO": "LL"}


def test_plan_keeps_the_rule_that_rejected_a_variant() -> None:
    def validate(variant: Variant) -> list[Problem]:
        # A stand-in for the profile validator with the shape it returns: Problems with rule ids.
        spec = variant_spec(BASE, variant)
        out = []
        if spec["server"]["cuda_graph"]:
            out.append(Problem("CUDA graphs with NSA on SM120", severity="warning", rule_id="sm120-nsa-cuda-graph"))
        if spec["server"]["max_running_requests"] > 512 and spec["server"]["cuda_graph"]:
            out.append(Problem("too many graphs", rule_id="graph-memory"))
        return out

    axes = parse_axes(["server.max_running_requests=256,1024", "server.cuda_graph=on,off"], BASE)
    planned = plan(BASE, axes, validate)
    assert [p.valid for p in planned] == [True, True, False, True]
    assert [p.rule_id for p in planned[2].errors] == ["graph-memory"]
    # A warning alone does not reject.
    assert planned[0].problems[0].severity == "warning"
