"""Service-level objectives: the latency a variant is held to, and whether a measurement meets it.

An SLO bounds the 99th percentile of time to first token, inter-token latency and end-to-end latency, in ms, any
subset (the profile's `bench.slo`, or `--slo ttft_p99_ms=3000,itl_p99_ms=100`). A measurement meets it when every
bound holds for the percentile measured from the benchmark's per-request results; a bound whose latency was not
measured is not met (an SLO nobody can check is not kept). Pure.

SGLang's bench_serving spells its `--goodput` bounds `ttft:MS tpot:MS e2el:MS`, per request, its tpot a request's
own mean inter-token time (not the p99 of every gap the toolkit's itl_p99_ms bounds). That spelling is accepted
too, as its own bounds (`ttft_ms`, `tpot_ms`, `e2el_ms`), and labelled as SGLang's definition wherever a figure
under it is shown (`slo_definition`): each per-request bound is held at the 99th percentile over the run's
requests, so a run meets it when 99 % of its requests meet that bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from toolkit.core.errors import ToolkitError

# key -> (latency name in a Measurement's latency_ms, percentile key, what it is)
BOUNDS: dict[str, tuple[str, str, str]] = {
    "ttft_p99_ms": ("ttft", "p99", "time to first token"),
    "itl_p99_ms": ("itl", "p99", "inter-token latency"),
    "e2e_p99_ms": ("e2e", "p99", "end-to-end latency"),
    # SGLang bench_serving --goodput's own names (per request)
    "ttft_ms": ("ttft", "p99", "time to first token (SGLang --goodput ttft, per request)"),
    "tpot_ms": ("tpot", "p99", "a request's mean time per output token (SGLang --goodput tpot)"),
    "e2el_ms": ("e2e", "p99", "end-to-end latency (SGLang --goodput e2el, per request)"),
}
SGLANG_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2el_ms"}
TOOLKIT_P99, SGLANG_GOODPUT = "toolkit-p99", "sglang-goodput"
SLO_DEFINITIONS = {
    TOOLKIT_P99: "the toolkit's: p99 over the run's requests of TTFT, of every inter-token gap, of end-to-end",
    SGLANG_GOODPUT: "SGLang 0.5.23 bench_serving --goodput's: per request, tpot a request's mean inter-token time "
                    "(held at the p99 over requests)",
}


def slo_definition(slo: Mapping[str, float]) -> str:
    """Which definition `slo`'s bounds follow: sglang-goodput when spelled as SGLang's --goodput, else toolkit-p99."""
    return SGLANG_GOODPUT if slo and all(k in SGLANG_KEYS.values() for k in slo) else TOOLKIT_P99


def _bound_ms(key: str, sep: str, value: str, field: str, example: str) -> float:
    """One bound's milliseconds: a positive, finite number, or an error naming it."""
    try:
        ms = float(value)
    except ValueError:
        raise ToolkitError.of(f"{key}{sep}{value!r} is not a number of milliseconds", field=field,
                              fix=example) from None
    if not ms > 0 or ms == float("inf"):
        raise ToolkitError.of(f"{key}{sep}{value} is not a positive, finite number of milliseconds", field=field,
                              fix=example)
    return ms


def parse_slo(text: str, *, field: str = "--slo") -> dict[str, float]:
    """`ttft_p99_ms=3000,itl_p99_ms=100` -> {"ttft_p99_ms": 3000.0, "itl_p99_ms": 100.0}; SGLang's `ttft:3000
    tpot:50` (bench_serving --goodput's KEY:MS pairs, by spaces or commas) -> {"ttft_ms": 3000.0, "tpot_ms": 50.0};
    bad input names the fix."""
    sglang = ":" in text and "=" not in text
    out: dict[str, float] = {}
    example = ("e.g. --slo 'ttft:3000 tpot:50' (SGLang's --goodput spelling)" if sglang
               else "e.g. --slo ttft_p99_ms=3000,itl_p99_ms=100")
    for part in (p.strip() for p in (text.replace(",", " ").split() if sglang else text.split(","))):
        if not part:
            continue
        key, eq, value = part.partition(":" if sglang else "=")
        key = key.strip()
        if not eq:
            raise ToolkitError.of(f"{part!r} is not KEY=MS", field=field, fix=example)
        if key not in (SGLANG_KEYS if sglang else BOUNDS):
            what = "SGLang --goodput bound" if sglang else "SLO bound"
            raise ToolkitError.of(f"unknown {what} {key!r}", field=field,
                                  fix=f"use {', '.join(SGLANG_KEYS if sglang else BOUNDS)} ({example})")
        ms = _bound_ms(key, eq, value, field, example)
        name = SGLANG_KEYS[key] if sglang else key
        if name in out:
            raise ToolkitError.of(f"{key} is given twice", field=field, fix="give each bound once")
        out[name] = ms
    if not out:
        raise ToolkitError.of("no SLO bound given", field=field, fix=example)
    return out


def slo_of_spec(spec: Mapping[str, Any]) -> dict[str, float] | None:
    """The profile's bench.slo (its set bounds), None when it has none."""
    slo = ((spec.get("bench") or {}).get("slo")) or {}
    got = {k: float(v) for k, v in slo.items() if k in BOUNDS and v is not None}
    return got or None


def slo_text(slo: Mapping[str, float]) -> str:
    """The SLO as parse_slo reads it back (SGLang's spelling kept as SGLang's)."""
    if slo_definition(slo) == SGLANG_GOODPUT:
        back = {v: k for k, v in SGLANG_KEYS.items()}
        return " ".join(f"{back[k]}:{v:g}" for k, v in slo.items())
    return ",".join(f"{k}={v:g}" for k, v in slo.items())


@dataclass(frozen=True)
class Bound:
    key: str  # ttft_p99_ms
    limit_ms: float
    value_ms: float | None  # None: not measured

    @property
    def ratio(self) -> float | None:
        return None if self.value_ms is None else self.value_ms / self.limit_ms

    @property
    def met(self) -> bool:
        return self.value_ms is not None and self.value_ms <= self.limit_ms

    def text(self) -> str:
        got = "not measured" if self.value_ms is None else f"{self.value_ms:,.1f} ms"
        return f"{self.key.replace('_ms', '')} {got} (bound {self.limit_ms:,.0f} ms)"


@dataclass(frozen=True)
class SloCheck:
    bounds: tuple[Bound, ...]

    @property
    def met(self) -> bool:
        return all(b.met for b in self.bounds)

    @property
    def binding(self) -> Bound | None:
        """The bound closest to (or furthest past) its limit: the latency that decides the capacity. A bound that
        was not measured binds first."""
        if not self.bounds:
            return None
        return max(self.bounds, key=lambda b: float("inf") if b.ratio is None else b.ratio)

    def text(self) -> str:
        return "; ".join(("" if b.met else "MISSED ") + b.text() for b in self.bounds)


def check_slo(slo: Mapping[str, float], latency_ms: Mapping[str, Mapping[str, float]] | None) -> SloCheck:
    """Each bound of `slo` against a measurement's latency percentiles ({"ttft": {"p99": ms}, ...})."""
    lat = latency_ms or {}
    bounds = []
    for key, limit in slo.items():
        name, q, _what = BOUNDS[key]
        value = (lat.get(name) or {}).get(q)
        bounds.append(Bound(key, float(limit), None if value is None else float(value)))
    return SloCheck(tuple(bounds))
