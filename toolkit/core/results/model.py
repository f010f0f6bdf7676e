"""The results block's data: one `ResultsEntry` per measured run, inside a `ResultsBlock`.

This is the `status` half of a profile (what was observed), next to the author's `spec` (what is wanted):
each entry records the hash of the resolved spec it measured, so a later change to the spec makes the
entry visibly stale instead of silently wrong.

Field order here IS the order in the file: the block is rendered from these models, so a reviewer
always finds the stamp first, then the figures, then the verdict. Units are in the names.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from toolkit.core.provenance import Provenance, ProvenanceKind

# Schema history (migrations live in toolkit/core/results/migrate.py):
#   1: written by the profiles engineer's importer: flat manual entries (figures beside the stamp).
#   2: this shape: stamp, then grouped figures (throughput / latency_ms / power / energy / verdict); an entry an
#      upgrade measured carries its `gate` (optional: every schema-2 block without one reads as before); a run
#      over several hosts carries its `fleet` (optional, the same way).
RESULTS_SCHEMA_VERSION = 2
DEFAULT_KEEP_LAST = 10


class _Strict(BaseModel):
    # A hand-edited typo in the block must be an error naming the field, not a silently dropped figure.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class LabNote(_Strict):
    """Set when the figures did not come from a real GPU serving a real model: the entry says so in the file itself.
    `load`: real GPUs measured under a load that is not a served model (its "tokens" are what its unit says)."""

    kind: Literal["stand-in", "engine-model", "replay", "load"]
    note: str


# The entry's lab kind as the toolkit's one provenance word list (toolkit.core.provenance) names it.
_LAB_PROVENANCE: dict[str, ProvenanceKind] = {"stand-in": "stand-in", "engine-model": "engine-model",
                                              "replay": "replayed", "load": "measured"}


class GpuStamp(_Strict):
    model: str | None = None
    count: int | None = None
    driver: str | None = None


class BenchSettings(_Strict):
    """What the benchmark ran, from its own result and command line (never the profile's wish): the settings
    that make two runs comparable. `command` is the command line as run (shell-quoted; secret flag values
    redacted)."""

    backend: str | None = None
    dataset: str | None = None
    num_prompts: int | None = None  # requests completed; the failed ones are counted apart
    failed: int | None = None
    input_len: int | None = None
    output_len: int | None = None
    range_ratio: float | None = None
    # "inf" (all requests at t0, the story's setting) or requests per second.
    request_rate: float | Literal["inf"] | None = None
    max_concurrency: int | None = None
    seed: int | None = None
    command: str | None = None
    # The profile's bench values where the run differs (the lab's smaller prompt count, a command after --).
    profile_asked: dict[str, str | int | float | None] | None = None
    # How long the benchmark ran (bench_serving's duration: first request sent to the last answer), seconds.
    duration_s: float | None = None


class Rates(_Strict):
    output_tok_per_s: float | None = None
    total_tok_per_s: float | None = None
    request_per_s: float | None = None


class SteadyRates(Rates):
    # The window [start, end] in seconds since the run's start over which the rates were taken.
    window_s: list[float] | None = None
    # Where the rates come from: the server's per-iteration counter, or the benchmark's own timeline; and
    # whether the window is the steady plateau or (none found) the whole benchmark window.
    source: str | None = None


class Throughput(_Strict):
    full_run: Rates = Field(default_factory=Rates)
    steady_state: SteadyRates | None = None
    peak_output_tok_per_s: float | None = None
    # Why the run has no steady state (too short, no plateau): then `steady_state` is absent, and the full-run
    # rate is all there is to compare.
    no_steady_state: str | None = None


class Percentiles(_Strict):
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


class Latency(_Strict):
    ttft: Percentiles | None = None
    itl: Percentiles | None = None
    tpot: Percentiles | None = None
    e2e: Percentiles | None = None


class GpuPower(_Strict):
    gpu: int
    mean_w: float | None = None
    p95_w: float | None = None
    limit_w: float | None = None
    # mean_w against limit_w: the story's "~250 W of 600 W" in one number.
    mean_of_limit_pct: float | None = None


class Power(_Strict):
    window: Literal["steady", "full"] | None = None  # which part of the run the figures cover
    per_gpu: list[GpuPower] = Field(default_factory=list)
    mean_w: float | None = None  # mean over GPUs of each GPU's mean (per GPU, not the sum)
    limit_w: float | None = None  # per GPU, only where per_gpu does not say it (manual imports)
    idle_w: float | None = None  # per GPU, before the load started


class Energy(_Strict):
    window: Literal["steady", "full"] | None = None
    j_per_output_tok: float | None = None
    output_tok_per_j: float | None = None
    # How the energy was obtained: "counter" (NVML total-energy deltas) or "integrated" (power x time).
    method: str | None = None


EvidenceValue = str | int | float | bool | None


class VerdictExcerpt(_Strict):
    """The results block's excerpt of the probe's verdict (toolkit.core.probe.verdict.Verdict, verdict.json): what a
    diff and a comparison need, one figure per line."""

    class_: str = Field(alias="class")
    summary: str | None = None  # the probe's headline
    confidence: float | None = None
    basis: str | None = None  # "gpm" or "power+util+clocks": what the judgement rests on
    # The probe's evidence, flattened to dotted names (gpm.sm_util_pct), sorted: one figure per line in a diff.
    evidence: dict[str, EvidenceValue] = Field(default_factory=dict)


class GateChange(_Strict):
    """A change by the objective (new over old, less 1; J/token: old over new, so above zero is always better)
    with its 95 % interval and how it was made (toolkit.core.stats)."""

    value: float
    low: float
    high: float
    method: str


class Gate(_Strict):
    """Set on the entries an upgrade measured (`toolkit upgrade`): which side of the comparison the run was, and
    what was decided on all of them. A refused release's runs say `refused` with the loss's interval, so no entry
    claims it better."""

    decision: Literal["promoted", "refused", "rolled-back"]
    side: Literal["old", "new"]
    from_version: str
    to_version: str
    objective: str
    pairs: int
    change: GateChange | None = None
    outcome: str | None = None  # gain, loss, equal, undecided, failed (toolkit.core.stats)
    slo_definition: str | None = None  # under an SLO: which definition its figures follow


class FleetNode(_Strict):
    """One host of a run over several hosts, judged on the controller's clock over the benchmark's window."""

    host: str
    gpu_count: int | None = None
    power_w: float | None = None  # the host's GPUs summed, mean over the window
    power_of_limit: float | None = None
    util_gpu_pct: float | None = None
    sm_clock_mhz: float | None = None
    energy_j: float | None = None
    generated_tokens: float | None = None  # what its server counted (a rank that serves nothing: none)
    output_tok_per_j: float | None = None
    net_gb_s: float | None = None  # its busiest interface, mean over the window
    clock_offset_ms: float | None = None  # the host's clock minus the controller's, at the run's start
    clock_bound_ms: float | None = None  # the offset's uncertainty over the run (the wider end's)
    verdict: str | None = None  # the node judged alone


class FleetResult(_Strict):
    """A run over several hosts (`toolkit apply --probe` of a profile over nodes or replicas): the fleet's figures
    beside each node's. The entry's energy and verdict are the fleet's."""

    layout: Literal["nodes", "replicas"]
    hosts: int
    gpu_count: int | None = None
    power_w: float | None = None
    energy_j: float | None = None
    output_tok_per_j: float | None = None
    network_gb_s: float | None = None  # the NCCL preflight's bus bandwidth, what the verdict weighs traffic by
    clock_bound_ms: float | None = None  # the widest host's
    nodes: list[FleetNode] = Field(default_factory=list)


class ResultsEntry(_Strict):
    run_id: str
    source: Literal["toolkit", "manual"]
    # ISO 8601 (UTC) of the run's start: the run's date, not the recording's, so re-recording is a no-op.
    # Imported manual figures may have none.
    date: str | None = None
    spec_hash: str | None = None
    lab: LabNote | None = None
    approximate: bool | None = None  # manual figures quoted as "about" (the story's ~880 tok/s)
    sglang_version: str | None = None
    host: str | None = None
    gpu: GpuStamp = Field(default_factory=GpuStamp)
    bench: BenchSettings = Field(default_factory=BenchSettings)
    throughput: Throughput = Field(default_factory=Throughput)
    latency_ms: Latency | None = None
    power: Power | None = None
    energy: Energy | None = None
    verdict: VerdictExcerpt | None = None
    artifacts: str | None = None
    note: str | None = None  # manual entries: where the figures came from
    gate: Gate | None = None  # an upgrade's run: its side and the decision on the runs
    fleet: FleetResult | None = None  # a run over several hosts: per-node figures beside the fleet's

    # Convenience views used by compare, diff and report.
    def output_tok_per_s(self) -> tuple[float | None, str]:
        """The best output rate and which one it is ("steady" or "full"). A rate over the whole benchmark window
        because no steady window was found (entries recorded before `no_steady_state`) is not steady."""
        s = self.throughput.steady_state
        if (s is not None and s.output_tok_per_s is not None and not self.throughput.no_steady_state
                and "no steady window found" not in (s.source or "")):
            return s.output_tok_per_s, "steady"
        return self.throughput.full_run.output_tok_per_s, "full"

    def verdict_class(self) -> str | None:
        return self.verdict.class_ if self.verdict else None

    def provenance(self) -> Provenance:
        """Where the figures came from. A load that is not a served model (`lab.kind` load) was measured on real
        GPUs: it is told apart from a model's figures by its workload, which is never a served model's."""
        if self.source == "manual":
            return Provenance("imported", self.note)
        if self.lab is None:
            return Provenance("measured", None)
        return Provenance(_LAB_PROVENANCE[self.lab.kind], self.lab.note)


class ResultsBlock(_Strict):
    schema_version: int = RESULTS_SCHEMA_VERSION
    keep_last: int = Field(default=DEFAULT_KEEP_LAST, ge=1)
    entries: list[ResultsEntry] = Field(default_factory=list)
