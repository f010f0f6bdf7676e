"""Which flag each typed knob renders on the pinned SGLang release: data, not branches in the renderer.

A knob has its first spelling (the 0.5.9 flags the profiles were written against). A newer spelling comes
from two places:
- the pinned release's own catalogue: a deprecated flag whose `new_flag` (or help text) names a plain
  replacement, `--flag`, `--flag=value` or `--a-{x,y}=value`, is followed to it;
- RENAMES, a small table of SGLang's semantic renames, each with its source: it carries what a release
  that already removed the old flag no longer says (0.5.20 removed the deprecated NSA names, sglang#38375),
  and the renames no catalogue can spell (`--attn-dp-size <dp-size>` instead of `--dp-size N
  --enable-dp-attention`).

`knob_flags(catalogue)` picks, per knob, the newest spelling whose flags the release has and does not
deprecate; else the newest it still accepts (deprecated: validate warns); else none: the knob has no
counterpart in that release (validate and migrate refuse it, and nothing renders a flag the release removed).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolkit.core.profile.catalogue import Catalogue

# A flag and the value it renders: "{value}" is the knob's own value, "{dp_size}" another server knob's,
# anything else a literal; None renders the flag alone (a switch).
FlagValue = tuple[str, str | None]
Spelling = tuple[FlagValue, ...]


@dataclass(frozen=True)
class Rename:
    """SGLang replaced `old` by `new` (one or more flags with their values); `drops` are flags the new
    spelling makes redundant (they are not rendered when it is chosen)."""

    old: str
    new: Spelling
    source: str
    drops: tuple[str, ...] = ()


RENAMES: tuple[Rename, ...] = (
    Rename(
        "--nsa-prefill-backend",
        (("--dsa-prefill-backend", "{value}"),),
        "SGLang 0.5.13 renamed NSA to DSA: --nsa-prefill-backend became a deprecated alias of --dsa-prefill-backend "
        "(server_args.py, DeprecatedAliasStoreAction); 0.5.20 removed the alias "
        "(https://github.com/sgl-project/sglang/pull/38375)",
    ),
    Rename(
        "--nsa-decode-backend",
        (("--dsa-decode-backend", "{value}"),),
        "SGLang 0.5.13 renamed NSA to DSA: --nsa-decode-backend became a deprecated alias of --dsa-decode-backend "
        "(server_args.py, DeprecatedAliasStoreAction); 0.5.20 removed the alias "
        "(https://github.com/sgl-project/sglang/pull/38375)",
    ),
    Rename(
        "--disable-cuda-graph",
        (("--cuda-graph-backend-decode", "disabled"), ("--cuda-graph-backend-prefill", "disabled")),
        "SGLang 0.5.14's CUDA graph refactor: 'Deprecated. Use --cuda-graph-backend-{decode,prefill}=disabled "
        "instead' (https://github.com/sgl-project/sglang/pull/23906)",
    ),
    Rename(
        "--cuda-graph-max-bs",
        (("--cuda-graph-max-bs-decode", "{value}"),),
        "SGLang 0.5.14: 'Deprecated alias for --cuda-graph-max-bs-decode' "
        "(https://github.com/sgl-project/sglang/pull/23906); 0.5.20 removed the alias "
        "(https://github.com/sgl-project/sglang/pull/38375)",
    ),
    Rename(
        "--enable-flashinfer-allreduce-fusion",
        (("--flashinfer-allreduce-fusion-backend", "auto"),),
        "SGLang 0.5.14: '(Deprecated: use --flashinfer-allreduce-fusion-backend=auto)' (server_args.py help)",
    ),
    Rename(
        "--enable-dp-attention",
        (("--attn-dp-size", "{dp_size}"),),
        "SGLang 0.5.22: 'Deprecated. Use --attn-dp-size <dp-size> instead of --dp-size <dp-size> "
        "--enable-dp-attention' (server_args.py)",
        drops=("--dp-size",),
    ),
)

_RENAMES_BY_OLD = {r.old: r for r in RENAMES}


def _is_one(v: Any) -> bool:
    return bool(v == 1)


@dataclass(frozen=True)
class Knob:
    """One typed `server` field: how it becomes flags. `kind` "value": the spelling with the value when set;
    "true": the spelling when True; "false": the spelling when False. `skip`: values that mean SGLang's
    default (no flag)."""

    field: str
    flag: str
    kind: str
    skip: Callable[[Any], bool] | None = None

    @property
    def first(self) -> Spelling:
        return ((self.flag, "{value}" if self.kind == "value" else None),)


# Order is the argv order.
SERVER_KNOBS: tuple[Knob, ...] = (
    Knob("tp_size", "--tp-size", "value"),
    Knob("pp_size", "--pp-size", "value", _is_one),
    Knob("ep_size", "--ep-size", "value", _is_one),
    Knob("dp_size", "--dp-size", "value", _is_one),
    Knob("enable_dp_attention", "--enable-dp-attention", "true"),
    Knob("nnodes", "--nnodes", "value", _is_one),
    Knob("node_rank", "--node-rank", "value"),
    Knob("dist_init_addr", "--dist-init-addr", "value"),
    Knob("attention_backend", "--attention-backend", "value"),
    Knob("prefill_attention_backend", "--prefill-attention-backend", "value"),
    Knob("decode_attention_backend", "--decode-attention-backend", "value"),
    Knob("nsa_prefill_backend", "--nsa-prefill-backend", "value"),
    Knob("nsa_decode_backend", "--nsa-decode-backend", "value"),
    Knob("moe_runner_backend", "--moe-runner-backend", "value"),
    Knob("flashinfer_autotune", "--disable-flashinfer-autotune", "false"),
    Knob("allreduce_fusion", "--enable-flashinfer-allreduce-fusion", "true"),
    Knob("max_running_requests", "--max-running-requests", "value"),
    Knob("chunked_prefill_size", "--chunked-prefill-size", "value"),
    Knob("num_continuous_decode_steps", "--num-continuous-decode-steps", "value"),
    Knob("mem_fraction_static", "--mem-fraction-static", "value"),
    Knob("kv_cache_dtype", "--kv-cache-dtype", "value"),
    Knob("cuda_graph", "--disable-cuda-graph", "false"),
    Knob("cuda_graph_max_bs", "--cuda-graph-max-bs", "value"),
    Knob("radix_cache", "--disable-radix-cache", "false"),
    Knob("enable_metrics", "--enable-metrics", "true"),
)


@dataclass(frozen=True)
class Step:
    """One move from a spelling to a newer one, and what says so."""

    old: str
    new: Spelling
    source: str
    drops: tuple[str, ...] = ()


@dataclass(frozen=True)
class Choice:
    """The spelling a knob renders on one release, or why it has none."""

    knob: Knob
    spelling: Spelling | None  # None: no counterpart in this release
    steps: tuple[Step, ...] = ()  # how it got there from the first spelling
    deprecated: bool = False  # the release accepts it but deprecates it (no live spelling exists)
    reason: str = ""  # for spelling None: what the release lacks

    @property
    def drops(self) -> tuple[str, ...]:
        return tuple(d for s in self.steps for d in s.drops)


_BRACES = re.compile(r"^(--[a-z0-9-]*)\{([a-z0-9,-]+)\}([a-z0-9-]*)$")


def parse_replacement(text: str | None, old_takes_value: bool) -> Spelling | None:
    """SGLang's `new_flag` text as a spelling, when it is a plain one: `--flag` (an alias, same value),
    `--flag=value`, `--flag value`, `--a-{x,y}=value`. A placeholder (`--attn-dp-size <dp-size>`) is not
    plain: RENAMES says what it means."""
    if not text or "<" in text:
        return None
    flag, sep, value = text.replace(" ", "=", 1).partition("=")
    if not sep:
        return ((flag, "{value}" if old_takes_value else None),) if re.fullmatch(r"--[a-z0-9-]+", flag) else None
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", value):
        return None
    braces = _BRACES.match(flag)
    if braces:
        head, alts, tail = braces.groups()
        return tuple((f"{head}{alt}{tail}", value) for alt in alts.split(","))
    return ((flag, value),) if re.fullmatch(r"--[a-z0-9-]+", flag) else None


def _next_step(spelling: Spelling, catalogue: Catalogue | None) -> Step | None:
    """The rename of the spelling's first renamed flag: the table's, else the release's own deprecation."""
    for i, (flag, value) in enumerate(spelling):
        rename = _RENAMES_BY_OLD.get(flag)
        new: Spelling | None = None
        source = ""
        drops: tuple[str, ...] = ()
        if rename is not None:
            new, source, drops = rename.new, rename.source, rename.drops
        elif catalogue is not None:
            info = catalogue.get(flag)
            if info is not None and info.deprecated and info.replacement:
                parsed = parse_replacement(info.replacement, info.takes_value)
                if parsed is not None and value == "{value}" and any(v != "{value}" for _, v in parsed):
                    parsed = None  # a value mapped onto fixed values is a semantic rename: RENAMES says it
                if parsed is not None and value is not None and value != "{value}":
                    parsed = None  # a literal value (from an earlier rename) moves only by RENAMES too
                if parsed is not None:
                    new = parsed
                    source = (
                        f"SGLang {catalogue.sglang_version} deprecates {flag}: use {info.replacement} "
                        "(its own argument declaration)"
                    )
        if new is not None:
            new_spelling = (*spelling[:i], *(_carry(n, value) for n in new), *spelling[i + 1 :])
            return Step(flag, new_spelling, source, drops)
    return None


def _carry(new: FlagValue, old_value: str | None) -> FlagValue:
    flag, value = new
    return (flag, old_value) if value == "{value}" else (flag, value)


def spellings(knob: Knob, catalogue: Catalogue | None) -> list[tuple[Spelling, tuple[Step, ...]]]:
    """The knob's spellings, oldest first, each with the steps that lead to it."""
    out: list[tuple[Spelling, tuple[Step, ...]]] = [(knob.first, ())]
    seen = {knob.first}
    while True:
        spelling, steps = out[-1]
        step = _next_step(spelling, catalogue)
        if step is None or step.new in seen:
            return out
        seen.add(step.new)
        out.append((step.new, (*steps, step)))


def choose(knob: Knob, catalogue: Catalogue | None) -> Choice:
    """The spelling of `knob` on the catalogue's release (its first spelling when no catalogue is known)."""
    options = spellings(knob, catalogue)
    if catalogue is None:
        return Choice(knob, options[0][0])
    for spelling, steps in reversed(options):
        if all(catalogue.live(flag) for flag, _ in spelling):
            return Choice(knob, spelling, steps)
    for spelling, steps in reversed(options):
        infos = [catalogue.get(flag) for flag, _ in spelling]
        if all(i is not None and i.error is None for i in infos):
            return Choice(knob, spelling, steps, deprecated=True)
    tried = " / ".join(" ".join(f for f, _ in s) for s, _ in options)
    return Choice(
        knob,
        None,
        options[-1][1],
        reason=f"SGLang {catalogue.sglang_version} has none of {tried}",
    )


def knob_flags(catalogue: Catalogue | None) -> dict[str, Choice]:
    """field -> its Choice on this release, for every typed knob."""
    return {k.field: choose(k, catalogue) for k in SERVER_KNOBS}


def renamed_flag(flag: str, new: Catalogue, history: Sequence[Catalogue | None] = ()) -> Step | None:
    """Where an extra_args flag moves on `new`: None when `new` accepts it live (or nothing better is known).
    `history`: catalogues of other releases whose deprecations say more (a flag renamed in 0.5.14 and removed in
    0.5.20 is known only to the releases between). Only flag-for-flag renames apply: a value stays a value, a
    switch a switch (an extra_args token's value is opaque here)."""
    if new.live(flag):
        return None
    catalogues = [c for c in (new, *history) if c is not None]
    known = next((c.get(flag) for c in catalogues if c.get(flag) is not None), None)
    probe = Knob("extra", flag, "value" if known is None or known.takes_value else "true")
    template = probe.first[0][1]
    for catalogue in catalogues:
        for spelling, steps in reversed(spellings(probe, catalogue)[1:]):
            single = len(spelling) == 1 and spelling[0][1] == template
            if single and new.live(spelling[0][0]) and not steps[-1].drops:
                return Step(flag, spelling, " / ".join(s.source for s in steps))
    return None
