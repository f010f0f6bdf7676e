"""Hardware rules as data: each an id, a condition, a severity, a message, a fix and its source.

A condition is a list of clauses that must all hold. A clause names a fact (a dotted path into the
resolved spec, or a derived fact below) and a test. To add a rule, append a Rule to RULES; the
tests check every rule fires on a profile made to trip it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from toolkit.core.profile.resolve import ResolvedProfile

# Architectures whose attention is NSA/DSA sparse attention (server_args.py: is_deepseek_nsa).
NSA_ARCHITECTURES = frozenset({"GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM"})


@dataclass(frozen=True)
class Clause:
    fact: str
    op: str  # eq, ne, in, not_in, gt, truthy, falsy
    value: Any = None

    def holds(self, facts: dict[str, Any]) -> bool:
        got = facts.get(self.fact)
        if self.op == "eq":
            return bool(got == self.value)
        if self.op == "ne":
            return bool(got != self.value)
        if self.op == "in":
            return got in self.value
        if self.op == "not_in":
            return got not in self.value
        if self.op == "gt":
            return got is not None and got > self.value
        if self.op == "truthy":
            return bool(got)
        if self.op == "falsy":
            return not got
        raise ValueError(f"unknown clause op {self.op!r}")


@dataclass(frozen=True)
class Rule:
    id: str
    when: tuple[Clause, ...]
    severity: str  # "error" or "warning"
    field: str  # the knob the problem is reported on (its file and line)
    message: str
    fix: str
    source: str  # the thread or measurement that justifies the rule


RULES: tuple[Rule, ...] = (
    Rule(
        id="sm120-allreduce-fusion",
        when=(Clause("target.compute_capability", "eq", "SM120"), Clause("server.allreduce_fusion", "truthy")),
        severity="error",
        field="server.allreduce_fusion",
        message="FlashInfer allreduce fusion needs SM90 or SM10x; on SM120 its kernels are not built "
        "(flashinfer jit/comm.py allows archs 9 and 10 only). Forcing the arch gate measured 236 tok/s at 125 W "
        "against 3,740 tok/s without it (seed)",
        fix="set server.allreduce_fusion: false on SM120",
        source="https://github.com/sgl-project/sglang/issues/15650",
    ),
    Rule(
        id="sm120-nsa-cuda-graph",
        when=(
            Clause("target.compute_capability", "eq", "SM120"),
            Clause("derived.nsa_attention", "truthy"),
            Clause("server.cuda_graph", "truthy"),
        ),
        severity="warning",
        field="server.cuda_graph",
        message="CUDA graphs with NSA attention on SM120 hit the page_table_1_flattened bug in the NSA path "
        "(crashes seen in the seed until graphs were disabled); decode graph capture can also hang (sglang#29580)",
        fix="set server.cuda_graph: false until the fix is in your pinned SGLang",
        source="https://github.com/sgl-project/sglang/issues/12964",
    ),
    Rule(
        id="pp-radix-nsa",
        when=(
            Clause("server.pp_size", "gt", 1),
            Clause("server.radix_cache", "truthy"),
            Clause("derived.nsa_attention", "truthy"),
        ),
        severity="warning",
        field="server.radix_cache",
        message="pipeline parallel with radix cache and NSA attention trips an assert in the NSA path",
        fix="set server.radix_cache: false when pp_size > 1 on an NSA model",
        source="https://github.com/sgl-project/sglang/issues/15086",
    ),
    Rule(
        id="sm120-nsa-default-backends",
        when=(
            Clause("target.compute_capability", "eq", "SM120"),
            Clause("derived.nsa_attention", "truthy"),
            Clause("server.nsa_decode_backend", "falsy"),
        ),
        severity="warning",
        field="server.nsa_decode_backend",
        message="SGLang's automatic NSA backend choice on SM120 gave NaN crashes in decode in the seed, "
        "until the decode backend was chosen by hand (trtllm)",
        fix="set server.nsa_decode_backend (the seed's working choice: trtllm)",
        source="https://github.com/sgl-project/sglang/issues/26087",
    ),
    Rule(
        id="nsa-phase-backend-leaves-nsa",
        when=(
            Clause("derived.nsa_architecture", "truthy"),
            Clause("derived.phase_backend_set", "truthy"),
            Clause("server.attention_backend", "ne", "nsa"),
        ),
        severity="warning",
        field="server.prefill_attention_backend",
        message="SGLang picks the nsa attention backend for an NSA model only while attention_backend, "
        "prefill_attention_backend and decode_attention_backend are all unset (server_args.py "
        "is_attention_backend_not_set); with a per-phase backend set it does not choose nsa, so the "
        "nsa_*_backend settings may not take effect",
        fix="if NSA is wanted, set server.attention_backend: nsa and pick nsa_prefill_backend/nsa_decode_backend; "
        "else confirm on the hardware (SGLang logs 'Use nsa attention backend' when NSA is on)",
        source="https://github.com/sgl-project/sglang/blob/v0.5.9/python/sglang/srt/server_args.py#L5114",
    ),
    Rule(
        id="flashinfer-cutlass-ep",
        when=(Clause("server.moe_runner_backend", "eq", "flashinfer_cutlass"), Clause("derived.ep_1_or_tp", "falsy")),
        severity="error",
        field="server.ep_size",
        message="the flashinfer_cutlass MoE runner takes ep_size 1 or ep_size = tp_size only "
        "(SGLang asserts it at startup)",
        fix="set server.ep_size to 1 or to server.tp_size, or choose another moe_runner_backend",
        source="https://github.com/sgl-project/sglang/blob/v0.5.9/python/sglang/srt/server_args.py#L2136",
    ),
    Rule(
        id="flashinfer-cutlass-quantization",
        when=(
            Clause("server.moe_runner_backend", "eq", "flashinfer_cutlass"),
            Clause("model.quantization", "not_in", ("modelopt_fp4", "modelopt_fp8", None)),
        ),
        severity="error",
        field="server.moe_runner_backend",
        message="the flashinfer_cutlass MoE runner supports modelopt_fp4, modelopt_fp8 or unquantized bf16 "
        "only (SGLang asserts it at startup)",
        fix="use a ModelOpt FP4/FP8 checkpoint, or choose another moe_runner_backend",
        source="https://github.com/sgl-project/sglang/blob/v0.5.9/python/sglang/srt/server_args.py#L2136",
    ),
    Rule(
        id="no-p2p-allreduce-bound",
        when=(
            Clause("target.p2p", "falsy"),
            Clause("target.interconnect", "eq", "pcie"),
            Clause("server.tp_size", "gt", 4),
        ),
        severity="info",
        field="server.tp_size",
        message="tensor parallel across GPUs without P2P sends every allreduce through the host: expect a "
        "communication-bound run (seed: 100 % util at ~250 W of 600 W per GPU)",
        fix="compare against expert parallel or TP4+PP2 (glm5-ep8, glm5-tp4-pp2)",
        source="seed: nvidia-smi during the 3,740 tok/s run",
    ),
)


def facts_of(resolved: ResolvedProfile) -> dict[str, Any]:
    """Flat facts the rules test: every dotted path of the spec, plus derived facts."""
    facts: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        else:
            facts[prefix] = value

    walk("", resolved.spec.model_dump(mode="json", exclude={"results", "why"}))
    server = resolved.spec.server
    facts["derived.nsa_attention"] = (
        resolved.spec.model.architecture in NSA_ARCHITECTURES
        or bool(server.nsa_decode_backend or server.nsa_prefill_backend)
        or server.attention_backend == "nsa"
    )
    facts["derived.ep_1_or_tp"] = server.ep_size in (1, server.tp_size)
    facts["derived.nsa_architecture"] = resolved.spec.model.architecture in NSA_ARCHITECTURES
    facts["derived.phase_backend_set"] = bool(server.prefill_attention_backend or server.decode_attention_backend)
    return facts


def matching_rules(resolved: ResolvedProfile, rules: tuple[Rule, ...] = RULES) -> list[Rule]:
    facts = facts_of(resolved)
    return [rule for rule in rules if all(clause.holds(facts) for clause in rule.when)]
