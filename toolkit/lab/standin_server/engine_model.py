"""A documented model of a serving engine on the profile's GPUs: the lab's stand-in for what SGLang and the
GPUs would do. SIMULATED: every figure it produces is a model's, not a measurement, and says so.

Used by the stand-in server (server.py: its timing, admission, KV pool, retraction, /metrics and /v1/loads) and,
through the stand-in's lab-only GET /lab/gpus, by the lab probe's simulated GPU sampler (power and utilisation
of each GPU over time from the engine's state). Pure and standard library only: it is copied into the lab's
container beside server.py; `simulate()` runs the same scheduler on a virtual clock (the calibration tests).

## The scheduler (SGLang 0.5.9's, simplified; srt/managers/scheduler.py, schedule_policy.py)
- One loop. While requests wait and a prefill can admit one, the next forward is a prefill batch (decode
  pauses, as without --enable-mixed-chunk); else one decode step for every running request; else idle.
- Admission, in arrival order: at most `max_running_requests` running; the prefill batch's new tokens at most
  `chunked_prefill_size` (one longer prompt is still admitted alone: chunking is not modelled); and the KV pool
  must hold what is used plus the new prompts plus `new_token_ratio` x every admitted request's remaining
  output (SGLang's reservation estimate: starts at 0.7, decays to 0.098 over 600 decode steps, jumps up after
  a retraction). bench_serving's requests always generate their max_tokens (ignore_eos), so a ratio under 1
  overcommits a tight pool: that is what retracts.
- KV pool: `max_total_num_tokens` = (GPU memory x mem_fraction_static - weights per GPU) / KV bytes per token;
  a request holds input + generated tokens. If a decode step would overflow the pool, the latest admitted
  requests are retracted (their KV freed, back to the front of the queue, recomputed when admitted again) until
  the step fits: "KV cache pool is full. Retract requests."
- Metrics as 0.5.9 writes them (SGLang 0.5.9's srt/metrics/collector.py): gauges at every prefill batch and every
  `decode_log_interval` decode steps (stale in between), `realtime_tokens_total` every forward, token counters
  and latency histograms at request finish; /v1/loads computed live.

## Timing (per forward, milliseconds), calibrated to the GLM-5 story (docs/story.md)
decode step with B running = compute(B) + comm(B):
  compute(B) = (C0 + C1 x B) x 8 / tp                    the GPU's own work, split over tp GPUs
  comm(B)    = (A0 + A1 x B) x link_factor(tp, p2p)      two allreduces per layer; over PCIe without P2P every
                                                          one is staged through host memory, so its fixed cost
                                                          (A0) dominates small batches
prefill of T tokens = compute (C0 + P1 x T) x 8 / tp + comm (A0 + PA x T) x link_factor
The constants are fitted so that the story's benchmark (1024 prompts, random 256 in / 128 out, range ratio 0,
rate inf) run through `simulate()` gives ~880 tok/s with max_running_requests 64 and ~3,740 tok/s with 1024
on 8 GPUs over PCIe without P2P (tests/apply/test_engine_model.py checks both, and ~250 W of 600).
link_factor = (tp - 1) / 7 for PCIe without P2P (1 at tp8), a fifth of that with P2P or NVLink; 0 at tp1.

## Power (per GPU)
busy: the compute part of a forward draws the board's default limit (default_limit_w: at full clock the story's
compute phases sit at the 600 W the board allows), its communication part idle_w: the GPU spins in NCCL's kernels
while it waits on the allreduce, so utilisation is 100 % for the whole forward while the power stays near idle for
its communication part: the story's "100 % utilisation, ~250 W of 600". idle: idle_w, utilisation 0. `power_w` is a
1 s average (as NVML's on Ampere and newer), `power_instant_w` the current forward's. GPM SM utilisation = compute
share (SMs do work only in the compute part).

## The power limit (nvidia-smi -pl): limit -> clock -> step time
A limit L below what a phase draws at full clock makes the driver lower the SM clock until the phase fits
(clock-event reason "SW power cap"). Dynamic power grows with the clock as f^POWER_CLOCK_EXPONENT, so a compute
phase's clock under L is clock_max x ((L - idle_w) / (default_limit_w - idle_w)) ^ (1 / POWER_CLOCK_EXPONENT)
(never above clock_max). Only the SM-bound share of a phase's compute time stretches with the clock (decode is
largely memory-bound: SM_BOUND_DECODE; prefill is compute-bound: SM_BOUND_PREFILL); the communication part, where
the GPU waits at idle-level power, is not slowed at all (a limit is never set below idle). So a cap costs a
compute-bound run its throughput and a busy-but-waiting one almost nothing, while each compute part draws L instead
of the default limit.
Calibration (an H200 measured on this project's device machine, driver 580, 700 W default limit): a bf16 matmul
loop held at the limit ran 1,470-1,530 MHz at 692-700 W, 123 W idle after work; its first samples at the maximum
1,980 MHz, before the cap engaged, read up to 875 W. Dynamic power 752 W at 1,980 MHz against 577 W at ~1,515 MHz
bounds the exponent from below by 1 (those first samples may not be at full activity yet); f x V^2 with V rising
linearly in f bounds it from above by 3. POWER_CLOCK_EXPONENT = 2 is the middle, not a measurement of a limit ->
clock curve (that needs a GPU whose limit may be changed); the SM-bound shares are estimates.
"""

from __future__ import annotations

import bisect
import collections
import math
import random
from dataclasses import dataclass, field
from typing import Any

SIMULATED = "simulated"
MODEL_NOTE = ("simulated: the lab's engine model (toolkit/lab/standin_server/engine_model.py), calibrated to the "
              "GLM-5 story's figures (docs/story.md); not SGLang, not a GPU")

# Calibrated constants (milliseconds); see the module docstring and tests/apply/test_engine_model.py.
C0_MS, C1_MS = 4.8, 0.0615  # decode compute at tp8: fixed, per running request
A0_MS, A1_MS = 32.6, 0.1025  # decode communication at tp8, PCIe without P2P: fixed, per running request
P1_MS = 0.0082  # prefill compute per new token at tp8
PA_MS = 0.0027  # prefill communication per new token at tp8 (activations of every token are allreduced)
# SGLang's global_config: init 0.7, min 0.7 x 0.14, decayed to the min over 600 decode steps.
NEW_TOKEN_RATIO_INIT, NEW_TOKEN_RATIO_MIN = 0.7, 0.098
NEW_TOKEN_RATIO_DECAY = (NEW_TOKEN_RATIO_INIT - NEW_TOKEN_RATIO_MIN) / 600
NEW_TOKEN_RATIO_AFTER_RETRACT = 0.3  # added after a retraction (capped at 1)
DEFAULT_MEM_FRACTION_STATIC = 0.88  # SGLang 0.5.9 picks by GPU memory; ~0.88 for a 96 GiB GPU
DEFAULT_CHUNKED_PREFILL_SIZE = 8192
DEFAULT_DECODE_LOG_INTERVAL = 40  # ServerArgs.decode_log_interval
IDLE_REFRESH_S = 30.0  # scheduler_runtime_checker_mixin: gauges rewritten when idle for 30 s
# The power limit's effect (module docstring, "The power limit").
POWER_CLOCK_EXPONENT = 2.0
SM_BOUND_DECODE = 0.5  # of a decode step's compute time: the rest waits on memory and keeps its pace under a cap
SM_BOUND_PREFILL = 0.9
SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap


@dataclass(frozen=True)
class ModelFacts:
    """What the model costs in memory. GLM-5-NVFP4 figures are estimates (documented, not measured)."""

    name: str = "GLM-5-NVFP4"
    weights_gib: float = 392.0  # ~744 B parameters at ~4.5 bits (FP4 + scales), total over all GPUs
    # MLA/DSA: the compressed KV (512 + 64 dims, bf16) and the indexer's keys of 78 layers, replicated per TP rank
    kv_bytes_per_token: int = 100_000


SMALL_MODEL = ModelFacts(name="small dense model (8B, bf16)", weights_gib=15.0, kv_bytes_per_token=131_072)


def facts_for(model_path: str) -> ModelFacts:
    """GLM-5's memory figures for the story's model, a small dense model's for anything else (a stand-in started
    by hand or by a test). The timing constants are the story's either way: only GLM-5 at tp8 is calibrated."""
    return ModelFacts() if "glm-5" in model_path.lower() else SMALL_MODEL


@dataclass(frozen=True)
class Hardware:
    gpu_name: str = "NVIDIA RTX PRO 6000 Blackwell"
    gpu_count: int = 8
    gpu_memory_gib: float = 96.0
    power_limit_w: float = 600.0  # enforced per GPU (nvidia-smi -pl); what NVML reports as the limit
    idle_power_w: float = 87.0  # the story's idle
    # The board's default limit: what a compute phase draws at full clock. None: the enforced limit (no cap set).
    default_limit_w: float | None = None
    p2p: bool = False
    interconnect: str = "pcie"
    sm_clock_max_mhz: float = 2430.0
    mem_clock_max_mhz: float = 14001.0


@dataclass(frozen=True)
class EngineConfig:
    tp_size: int = 1
    max_running_requests: int | None = None
    mem_fraction_static: float | None = None
    chunked_prefill_size: int | None = None
    decode_log_interval: int = DEFAULT_DECODE_LOG_INTERVAL
    model_name: str = "default"


class NotEnoughMemory(RuntimeError):
    """SGLang's model_runner raises this text when weights leave no room for the KV pool."""

    def __init__(self) -> None:
        super().__init__("Not enough memory. Please try to increase --mem-fraction-static.")


def link_factor(tp: int, hw: Hardware) -> float:
    if tp <= 1:
        return 0.0
    base = (tp - 1) / 7.0
    return base if (hw.interconnect == "pcie" and not hw.p2p) else base / 5.0


def clock_factor(power_limit_w: float, hw: Hardware) -> float:
    """SM clock / its maximum while a compute phase runs under `power_limit_w` (1: no cap binds)."""
    demand = hw.default_limit_w or hw.power_limit_w
    if power_limit_w >= demand:
        return 1.0
    headroom = max(power_limit_w - hw.idle_power_w, 1e-6) / (demand - hw.idle_power_w)
    return min(1.0, headroom ** (1.0 / POWER_CLOCK_EXPONENT))


def kv_capacity_tokens(cfg: EngineConfig, hw: Hardware, facts: ModelFacts) -> int:
    frac = cfg.mem_fraction_static if cfg.mem_fraction_static is not None else DEFAULT_MEM_FRACTION_STATIC
    tp = max(1, cfg.tp_size)
    kv_gib = hw.gpu_memory_gib * frac - facts.weights_gib / tp
    if kv_gib <= 0:
        raise NotEnoughMemory()
    return int(kv_gib * 2**30 / facts.kv_bytes_per_token)


@dataclass
class Req:
    rid: str
    input_len: int
    output_len: int
    arrival_s: float
    generated: int = 0
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None
    last_token_s: float | None = None
    retractions: int = 0
    recompute: int = 0  # tokens to recompute at the next admission (after a retraction)

    @property
    def kv_tokens(self) -> int:
        return self.input_len + self.generated


@dataclass(frozen=True)
class Forward:
    kind: str  # "prefill" | "decode"
    duration_s: float
    compute_s: float
    batch: int
    new_tokens: int
    reqs: tuple[Req, ...]

    @property
    def compute_share(self) -> float:
        return self.compute_s / self.duration_s if self.duration_s > 0 else 0.0


class Histogram:
    def __init__(self, buckets: list[float]) -> None:
        self.buckets = buckets
        self.counts = [0.0] * (len(buckets) + 1)
        self.sum = 0.0

    def observe(self, v: float, n: float = 1.0) -> None:
        self.counts[bisect.bisect_left(self.buckets, v)] += n
        self.sum += v  # SGLang's ITL shortcut: one gap added to _sum, n tokens to one bucket

    @property
    def count(self) -> float:
        return sum(self.counts)


TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000]
QUEUE_BUCKETS = [0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100, 200, 300, 400, 500,
                 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800, 2000, 2500, 3000]


@dataclass
class Gauges:
    """The scheduler's gauges as last written by log_stats (stale between writes, as in SGLang)."""

    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    num_used_tokens: int = 0
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    num_retracted_reqs: int = 0
    new_token_ratio: float = NEW_TOKEN_RATIO_INIT
    decode_sum_seq_lens: int = 0


@dataclass
class Counters:
    realtime: dict[str, float] = field(default_factory=lambda: {"prefill_compute": 0.0, "prefill_cache": 0.0,
                                                                "decode": 0.0})
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    cached_tokens: float = 0.0
    num_requests: float = 0.0
    num_aborted_requests: float = 0.0
    retracted_requests: float = 0.0
    retracted_input_tokens: float = 0.0
    retracted_output_tokens: float = 0.0


class Engine:
    """The scheduler and its metrics. Not thread-safe: the stand-in serialises calls with its own lock."""

    def __init__(self, cfg: EngineConfig, hw: Hardware | None = None, facts: ModelFacts | None = None) -> None:
        self.cfg = cfg
        self.hw = hw or Hardware()
        self.facts = facts or ModelFacts()
        self.tp = max(1, cfg.tp_size)
        # The enforced limit may change while the engine runs (the stand-in rereads the host's): set_power_limit.
        self.power_limit_w = self.hw.power_limit_w
        self.clock = clock_factor(self.power_limit_w, self.hw)
        # Every forward's time is multiplied by this: a run-to-run difference of the host's pace (the in-process
        # runner draws one per run; the stand-in server's real-time clock has its own).
        self.pace = 1.0
        self.max_total_num_tokens = kv_capacity_tokens(cfg, self.hw, self.facts)
        # SGLang: with no --max-running-requests, the KV pool decides (max_total_num_tokens // 2, capped).
        self.max_running_requests = cfg.max_running_requests or min(self.max_total_num_tokens // 2, 4096)
        self.chunked_prefill_size = cfg.chunked_prefill_size or DEFAULT_CHUNKED_PREFILL_SIZE
        self.waiting: collections.deque[Req] = collections.deque()
        self.running: list[Req] = []
        self.new_token_ratio = NEW_TOKEN_RATIO_INIT
        self.gauges = Gauges()
        self.counters = Counters()
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.queue_time = Histogram(QUEUE_BUCKETS)
        self.forward_ct_decode = 0
        self.retracted_since_log = 0
        self._decode_tokens_since_log = 0.0
        self._last_decode_log_s: float | None = None
        self._last_log_s = 0.0
        self.current: Forward | None = None
        self.current_start_s = 0.0
        self.log_lines: list[str] = []  # the scheduler's log lines since the last drain (decode, prefill, retract)
        # energy per GPU (joules) integrated over forwards and idle time, and (t, energy) for the 1 s average
        self.energy_j = 0.0
        self._energy_t = 0.0
        self._energy_hist: collections.deque[tuple[float, float]] = collections.deque()
        self.finished: list[Req] = []

    # -- requests ------------------------------------------------------------------------------------------------
    def add_request(self, req: Req) -> None:
        self.waiting.append(req)

    @property
    def used_tokens(self) -> int:
        return sum(r.kv_tokens for r in self.running)

    # -- timing --------------------------------------------------------------------------------------------------
    def set_power_limit(self, power_limit_w: float) -> None:
        """A new enforced limit (nvidia-smi -pl on the host): from the next forward on."""
        self.power_limit_w = float(power_limit_w)
        self.clock = clock_factor(self.power_limit_w, self.hw)

    def _times(self, compute_ms: float, comm_ms: float, sm_bound: float) -> tuple[float, float]:
        scale = 8.0 / self.tp
        # Under a power cap the SM-bound share of the compute stretches by 1 / clock; the rest keeps its pace.
        c = compute_ms * scale * ((1.0 - sm_bound) + sm_bound / self.clock)
        m = comm_ms * link_factor(self.tp, self.hw)
        return (c + m) * self.pace / 1000.0, c * self.pace / 1000.0

    def decode_time_s(self, batch: int) -> tuple[float, float]:
        return self._times(C0_MS + C1_MS * batch, A0_MS + A1_MS * batch, SM_BOUND_DECODE)

    def prefill_time_s(self, tokens: int) -> tuple[float, float]:
        return self._times(C0_MS + P1_MS * tokens, A0_MS + PA_MS * tokens, SM_BOUND_PREFILL)

    @property
    def compute_power_w(self) -> float:
        """What a compute part draws per GPU: the default limit at full clock, the enforced limit under a cap."""
        return min(self.power_limit_w, self.hw.default_limit_w or self.hw.power_limit_w)

    # -- the loop ------------------------------------------------------------------------------------------------
    def _reserved(self) -> float:
        return sum(r.kv_tokens + (r.output_len - r.generated) * self.new_token_ratio for r in self.running)

    def _admit(self) -> list[Req]:
        new: list[Req] = []
        tokens = 0
        reserved = self._reserved()
        while self.waiting and len(self.running) + len(new) < self.max_running_requests:
            r = self.waiting[0]
            need = r.input_len + r.generated + (r.output_len - r.generated) * self.new_token_ratio
            fill = r.input_len + r.recompute
            if new and tokens + fill > self.chunked_prefill_size:
                break
            if reserved + need > self.max_total_num_tokens and (self.running or new or
                                                                 fill > self.max_total_num_tokens):
                break  # an empty engine still takes the head request if its prompt fits: no deadlock
            self.waiting.popleft()
            new.append(r)
            tokens += fill
            reserved += need
        return new

    def next_forward(self, now: float) -> Forward | None:
        """Decide the next forward (admitting or retracting as SGLang would) and start it; None when idle."""
        self._account_energy(now)
        new = self._admit() if self.waiting else []
        if new:
            tokens = sum(r.input_len + r.recompute for r in new)
            for r in new:
                if r.admitted_s is None:
                    r.admitted_s = now
                    self.queue_time.observe(now - r.arrival_s)
            dur, comp = self.prefill_time_s(tokens)
            fwd = Forward("prefill", dur, comp, len(self.running), tokens, tuple(new))
        elif self.running:
            self._retract_if_full(now)
            b = len(self.running)
            dur, comp = self.decode_time_s(b)
            fwd = Forward("decode", dur, comp, b, b, tuple(self.running))
        else:
            if now - self._last_log_s > IDLE_REFRESH_S:
                self._log_stats(now, gen_throughput=0.0)
            self.current = None
            return None
        self.current, self.current_start_s = fwd, now
        return fwd

    def _retract_if_full(self, now: float) -> None:
        retracted: list[Req] = []
        while self.running and self.used_tokens + len(self.running) > self.max_total_num_tokens:
            r = self.running.pop()  # the latest admitted (SGLang sorts and retracts from the batch's end)
            self.counters.retracted_requests += 1
            self.counters.retracted_input_tokens += r.input_len
            self.counters.retracted_output_tokens += r.generated
            r.retractions += 1
            r.recompute = r.generated
            retracted.append(r)
        if retracted:
            for r in reversed(retracted):
                self.waiting.appendleft(r)
            old = self.new_token_ratio
            self.new_token_ratio = min(1.0, self.new_token_ratio + NEW_TOKEN_RATIO_AFTER_RETRACT)
            self.retracted_since_log += len(retracted)
            self.log_lines.append(f"KV cache pool is full. Retract requests. #retracted_reqs: {len(retracted)}, "
                                  f"#new_token_ratio: {old:.4f} -> {self.new_token_ratio:.4f}")

    def finish_forward(self, now: float) -> list[Req]:
        """The current forward ended at `now`: tokens out, finished requests out. Returns the requests that got a
        token (the stand-in wakes their streams)."""
        fwd = self.current
        if fwd is None:
            return []
        self._account_energy(now)
        touched: list[Req] = []
        if fwd.kind == "prefill":
            running_before = len(self.running)
            self.counters.realtime["prefill_compute"] += fwd.new_tokens
            for r in fwd.reqs:
                r.recompute = 0
                if r.generated == 0:
                    r.generated = 1  # the prefill's forward samples the first token
                    r.first_token_s = now
                    self.ttft.observe(now - r.arrival_s)
                r.last_token_s = now
                self.running.append(r)
                touched.append(r)
            self._finish_done(now)
            self._log_stats(now, running=running_before, prefill=fwd)
        else:
            for r in fwd.reqs:
                if r.last_token_s is not None:
                    self.itl.observe(now - r.last_token_s)
                r.generated += 1
                r.last_token_s = now
                touched.append(r)
            self.counters.realtime["decode"] += fwd.batch
            self._decode_tokens_since_log += fwd.batch
            self.forward_ct_decode += 1
            self.new_token_ratio = max(NEW_TOKEN_RATIO_MIN, self.new_token_ratio - NEW_TOKEN_RATIO_DECAY)
            self._finish_done(now)
            if self.forward_ct_decode % self.cfg.decode_log_interval == 0:
                since = self._last_decode_log_s
                gap = now - since if since is not None else None
                tput = self._decode_tokens_since_log / gap if gap else 0.0
                self._decode_tokens_since_log = 0.0
                self._last_decode_log_s = now
                # SGLang logs the batch that just ran (its finished requests are filtered out at the next
                # step's get_next_batch_to_run), so a full batch reads max_running_requests.
                self._log_stats(now, running=fwd.batch, gen_throughput=tput, decode=True)
        self.current = None
        return touched

    def _finish_done(self, now: float) -> None:
        keep = []
        for r in self.running:
            if r.generated >= r.output_len:
                r.finished_s = now
                self.counters.prompt_tokens += r.input_len
                self.counters.generation_tokens += r.generated
                self.counters.num_requests += 1
                self.e2e.observe(now - r.arrival_s)
                self.finished.append(r)
            else:
                keep.append(r)
        self.running = keep

    def _log_stats(self, now: float, *, running: int | None = None, gen_throughput: float | None = None,
                   prefill: Forward | None = None, decode: bool = False) -> None:
        g = self.gauges
        g.num_running_reqs = len(self.running) if running is None else running
        g.num_queue_reqs = len(self.waiting)
        g.num_used_tokens = self.used_tokens
        g.token_usage = round(g.num_used_tokens / self.max_total_num_tokens, 2)
        if gen_throughput is not None:
            g.gen_throughput = gen_throughput
        g.num_retracted_reqs = self.retracted_since_log
        g.new_token_ratio = self.new_token_ratio
        g.decode_sum_seq_lens = g.num_used_tokens
        self.retracted_since_log = 0
        self._last_log_s = now
        if decode:
            self.log_lines.append(f"Decode batch, #running-req: {g.num_running_reqs}, #token: {g.num_used_tokens}, "
                                  f"token usage: {g.token_usage:.2f}, cuda graph: False, gen throughput (token/s): "
                                  f"{g.gen_throughput:.2f}, #queue-req: {g.num_queue_reqs}")
        elif prefill is not None:
            self.log_lines.append(f"Prefill batch, #new-seq: {len(prefill.reqs)}, #new-token: {prefill.new_tokens}, "
                                  f"#cached-token: 0, token usage: {g.token_usage:.2f}, #running-req: "
                                  f"{g.num_running_reqs}, #queue-req: {g.num_queue_reqs}")

    # -- power ---------------------------------------------------------------------------------------------------
    def _power_now(self) -> tuple[float, float]:
        """(instant power per GPU in W, compute share) of what runs now."""
        hw = self.hw
        if self.current is None:
            return hw.idle_power_w, 0.0
        share = self.current.compute_share
        return hw.idle_power_w + (self.compute_power_w - hw.idle_power_w) * share, share

    def _account_energy(self, now: float) -> None:
        if now > self._energy_t:
            self.energy_j += self._power_now()[0] * (now - self._energy_t)
            self._energy_t = now
            self._energy_hist.append((now, self.energy_j))
            while len(self._energy_hist) > 2 and self._energy_hist[1][0] <= now - 1.0:
                self._energy_hist.popleft()

    def gpu_rows(self, now: float) -> list[dict[str, Any]]:
        """What NVML would read on each GPU now (SIMULATED). Deterministic small per-GPU spread (+-1.5 %)."""
        self._account_energy(now)
        inst, share = self._power_now()
        t_old, e_old = self._energy_hist[0] if self._energy_hist else (now, self.energy_j)
        avg = (self.energy_j - e_old) / (now - t_old) if now - t_old > 0.05 else inst
        busy = self.current is not None
        hw = self.hw
        rows = []
        for g in range(self.tp):
            k = 1.0 + 0.015 * math.sin(1.7 * g + 0.3)
            rows.append({
                "gpu": g,
                "power_w": round(avg * k, 2),
                "power_instant_w": round(inst * k, 2),
                "power_limit_w": self.power_limit_w,
                "energy_j": round(self.energy_j * k, 3),
                "util_gpu_pct": 100.0 if busy else 0.0,
                "util_mem_pct": round(100.0 * share * 0.6, 1) if busy else 0.0,
                # a 1 s reading sees the compute part at the capped clock and the waiting part at full clock
                "sm_clock_mhz": round(hw.sm_clock_max_mhz * (1.0 - share * (1.0 - self.clock)), 0) if busy else 180.0,
                "sm_clock_max_mhz": hw.sm_clock_max_mhz,
                "mem_clock_mhz": hw.mem_clock_max_mhz if busy else 405.0,
                "mem_clock_max_mhz": hw.mem_clock_max_mhz,
                "clock_reasons": (SW_POWER_CAP if self.clock < 1.0 and share > 0 else 0) if busy else 1,
                "temp_c": round(35 + 40 * (avg - hw.idle_power_w) / ((hw.default_limit_w or hw.power_limit_w)
                                                                     - hw.idle_power_w), 0),
                "gpm_sm_util_pct": round(100.0 * share, 2) if busy else 0.0,
                "gpm_tensor_util_pct": round(60.0 * share, 2) if busy else 0.0,
                "gpm_dram_bw_util_pct": round(45.0 * share, 2) if busy else 0.0,
            })
        return rows

    def topology(self) -> dict[str, Any]:
        hw = self.hw
        anc = "SYSTEM" if (hw.interconnect == "pcie" and not hw.p2p) else "NODE"
        return {
            "driver_version": None, "data_source": SIMULATED,
            "gpus": [{"index": g, "name": f"{hw.gpu_name} (simulated)", "power_limit_w": self.power_limit_w,
                      "sm_clock_max_mhz": hw.sm_clock_max_mhz, "mem_clock_max_mhz": hw.mem_clock_max_mhz,
                      "gpm_supported": True, "memory_gib": hw.gpu_memory_gib} for g in range(self.tp)],
            "links": [{"a": a, "b": b, "common_ancestor": anc, "p2p_read_ok": hw.p2p, "p2p_nvlink_ok": False}
                      for a in range(self.tp) for b in range(a + 1, self.tp)],
        }

    # -- what the server shows -------------------------------------------------------------------------------
    def loads(self) -> dict[str, Any]:
        """/v1/loads (live, as 0.5.9 computes it on each call; gen_throughput from the last stats)."""
        used = self.used_tokens
        d = {"dp_rank": 0, "num_running_reqs": len(self.running), "num_waiting_reqs": len(self.waiting),
             "num_used_tokens": used, "max_total_num_tokens": self.max_total_num_tokens,
             "token_usage": round(used / self.max_total_num_tokens, 4),
             "gen_throughput": round(self.gauges.gen_throughput, 2), "cache_hit_rate": 0.0, "utilization": 0.0,
             "max_running_requests": self.max_running_requests}
        d["num_total_reqs"] = d["num_running_reqs"] + d["num_waiting_reqs"]
        n = 1
        return {"dp_rank_count": n, "loads": [d], "aggregate": {
            "total_running_reqs": d["num_running_reqs"], "total_waiting_reqs": d["num_waiting_reqs"],
            "total_reqs": d["num_total_reqs"], "avg_token_usage": round(d["token_usage"], 4),
            "avg_throughput": d["gen_throughput"], "avg_utilization": 0.0}}

    def exposition(self) -> str:
        """/metrics as SGLang 0.5.9 serves it (prometheus_client multiprocess output: no _created, `pid` on
        mode-less gauges, histogram `_sum` first, counters' TYPE named with `_total`)."""
        m = self.cfg.model_name.replace("\\", "\\\\").replace('"', '\\"')
        sched = f'engine_type="unified",model_name="{m}",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
        tok = f'model_name="{m}"'
        g = self.gauges
        out: list[str] = []

        def metric(name: str, kind: str, doc: str, samples: list[tuple[str, str, float]]) -> None:
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{n}{{{labels}}} {float(v)!r}" for n, labels, v in samples)

        for name, doc, v in (
            ("num_running_reqs", "The number of running requests.", g.num_running_reqs),
            ("num_used_tokens", "The number of used tokens.", g.num_used_tokens),
            ("token_usage", "The token usage.", g.token_usage),
            ("gen_throughput", "The generation throughput (token/s).", g.gen_throughput),
            ("num_queue_reqs", "The number of requests in the waiting queue.", g.num_queue_reqs),
            ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
             self.max_total_num_tokens),
            ("decode_sum_seq_lens", "The sum of all sequence lengths in decode.", g.decode_sum_seq_lens),
            ("new_token_ratio", "The new token ratio.", g.new_token_ratio),
        ):
            metric(f"sglang:{name}", "gauge", doc, [(f"sglang:{name}", sched, v)])
        metric("sglang:num_retracted_reqs", "gauge", "The number of retracted requests.",
               [("sglang:num_retracted_reqs", sched + ',pid="1"', g.num_retracted_reqs)])
        c = self.counters
        for name, doc, v in (
            ("num_retracted_requests_total", "Total number of retracted requests due to kvcache full.",
             c.retracted_requests),
            ("num_retracted_input_tokens_total", "Total number of retracted input tokens.",
             c.retracted_input_tokens),
            ("num_retracted_output_tokens_total", "Total number of retracted output tokens.",
             c.retracted_output_tokens),
        ):
            metric(f"sglang:{name}", "counter", doc, [(f"sglang:{name}", sched, v)])
        metric("sglang:realtime_tokens_total", "counter", "Total number of tokens processed (updated on each log "
               "interval).", [("sglang:realtime_tokens_total", sched + f',mode="{k}"', v)
                              for k, v in c.realtime.items()])
        for name, doc, v in (
            ("prompt_tokens_total", "Number of prefill tokens processed.", c.prompt_tokens),
            ("generation_tokens_total", "Number of generation tokens processed.", c.generation_tokens),
            ("num_requests_total", "Number of requests processed.", c.num_requests),
            ("num_aborted_requests_total", "Number of requests aborted.", c.num_aborted_requests),
        ):
            metric(f"sglang:{name}", "counter", doc, [(f"sglang:{name}", tok, v)])
        metric("sglang:cached_tokens_total", "counter", "Number of cached prompt tokens.",
               [("sglang:cached_tokens_total", tok + f',cache_source="{s}"', c.cached_tokens)
                for s in ("device", "host", "total")])
        for name, doc, h, labels in (
            ("time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.ttft, tok),
            ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.itl, tok),
            ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", self.e2e, tok),
            ("queue_time_seconds", "Histogram of queueing time in seconds.", self.queue_time, sched),
        ):
            fam = f"sglang:{name}"
            samples = [(fam + "_sum", labels, h.sum)]
            cum = 0.0
            for le, n in zip([*h.buckets, math.inf], h.counts, strict=True):
                cum += n
                le_s = "+Inf" if le == math.inf else repr(float(le))
                samples.append((fam + "_bucket", f'le="{le_s}",' + labels, cum))
            samples.append((fam + "_count", labels, h.count))
            metric(fam, "histogram", doc, samples)
        return "\n".join(out) + "\n"


@dataclass(frozen=True)
class SimResult:
    duration_s: float
    completed: int
    output_tokens: int
    output_tok_per_s: float
    max_running: int
    max_queue: int
    mean_power_w: float  # per GPU, over the busy time
    retractions: int
    peak_token_usage: float


def random_workload(num_prompts: int, input_len: int, output_len: int, range_ratio: float = 0.0,
                    seed: int = 1) -> list[tuple[int, int]]:
    """bench_serving's random lengths: uniform integers in [max(int(L x r), 1), L] (compute_random_lens)."""
    rng = random.Random(seed)
    return [(rng.randint(max(int(input_len * range_ratio), 1), input_len),
             rng.randint(max(int(output_len * range_ratio), 1), output_len)) for _ in range(num_prompts)]


def simulate(cfg: EngineConfig, hw: Hardware | None, workload: list[tuple[int, int]]) -> SimResult:
    """The same scheduler on a virtual clock, every request arriving at t=0 (request rate inf)."""
    eng = Engine(cfg, hw)
    for i, (inp, out) in enumerate(workload):
        eng.add_request(Req(f"r{i}", inp, out, 0.0))
    now = 0.0
    max_run = max_q = 0
    busy_j = busy_s = 0.0
    peak_usage = 0.0
    while True:
        fwd = eng.next_forward(now)
        if fwd is None:
            break
        max_run = max(max_run, len(eng.running) + (len(fwd.reqs) if fwd.kind == "prefill" else 0))
        max_q = max(max_q, len(eng.waiting))
        peak_usage = max(peak_usage, eng.used_tokens / eng.max_total_num_tokens)
        p, _ = eng._power_now()
        busy_j += p * fwd.duration_s
        busy_s += fwd.duration_s
        now += fwd.duration_s
        eng.finish_forward(now)
    out_tokens = sum(r.generated for r in eng.finished)
    return SimResult(now, len(eng.finished), out_tokens, out_tokens / now if now else 0.0, max_run, max_q,
                     busy_j / busy_s if busy_s else eng.hw.idle_power_w, int(eng.counters.retracted_requests),
                     peak_usage)
