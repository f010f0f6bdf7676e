"""Variants as profiles: the text of a variant (`extends:` the base plus its knobs), validating it through
the profile package, and the promoted profile with a `why` per changed knob citing the sweep run.

Pure: the caller passes the profile loader and the validator (both from the profile store adapter).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from toolkit.core.errors import Problem, ToolkitError
from toolkit.core.profile.model import SCHEMA_VERSION
from toolkit.core.profile.resolve import ResolvedProfile, resolve
from toolkit.core.profile.source import ProfileSource, parse_profile_text
from toolkit.core.provenance import mark
from toolkit.core.sweep import capacity
from toolkit.core.sweep.ranking import RankedRow, ranking
from toolkit.core.sweep.state import SweepState
from toolkit.core.sweep.variants import Scalar, Validator, Variant, changed_knobs, format_value, set_path

# The keys the profile hash ignores (see toolkit.core.profile.hashing): prose and identity, not what runs.
_NOT_SPEC = {"description", "why", "results", "name", "extends", "schema_version"}


def base_spec(resolved: ResolvedProfile) -> dict[str, Any]:
    """The base's resolved spec as plain data, defaults filled in: the types `--vary` values take."""
    return resolved.spec.model_dump(mode="json", exclude=_NOT_SPEC)


def variant_profile_name(run_id: str, variant_id: str) -> str:
    return f"{run_id}-{variant_id}".lower()


def variant_profile_text(
    *,
    base: str,
    name: str,
    knobs: Mapping[str, Scalar],
    description: str,
    why: Mapping[str, Mapping[str, str]] | None = None,
    header: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
) -> str:
    """A profile that `extends:` the base and sets only `knobs` (dotted paths), plus a `why` per knob.

    Deterministic: sections in the profile's usual order, knobs in the order given, so a promotion re-run
    from the same state writes the same bytes.
    """
    doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "name": name, "extends": base, "description": description}
    body: dict[str, Any] = {}
    for path, value in knobs.items():
        set_path(body, path, value)
    for path, value in (extra or {}).items():
        set_path(body, path, value)
    for section in ("engine", "model", "server", "env", "gpu", "bench", "probe"):
        if section in body:
            doc[section] = body.pop(section)
    doc.update(body)
    if why:
        doc["why"] = {path: dict(w) for path, w in why.items()}
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=110, default_flow_style=False)
    return "".join(f"# {line}\n" for line in header) + text


def variant_source(base: str, variant: Variant, run_id: str) -> ProfileSource:
    name = variant_profile_name(run_id, variant.id)
    text = variant_profile_text(
        base=base, name=name, knobs=variant.knob_dict(), description=f"sweep {run_id} variant {variant.id}"
    )
    return parse_profile_text(name, f"--vary ({variant.id}: {variant.label})", text)


def resolve_variant(
    base: str, variant: Variant, run_id: str, loader: Callable[[str], ProfileSource]
) -> ResolvedProfile:
    """The variant resolved through the base's `extends:` chain, exactly as a profile file would be."""
    source = variant_source(base, variant, run_id)

    def load(n: str) -> ProfileSource:
        return source if n == source.name else loader(n)

    return resolve(source.name, load)


def profile_validator(
    base: str,
    run_id: str,
    loader: Callable[[str], ProfileSource],
    validate_resolved: Callable[[ResolvedProfile], Sequence[Problem]],
) -> Validator:
    """A Validator for plan(): each variant resolved as a profile and checked with the profile rules.

    A type error (e.g. max_running_requests=0 against `ge=1`) arrives as a ToolkitError from resolve and
    becomes the variant's problems, so the sweep skips it with the reason instead of stopping.
    """

    def check(variant: Variant) -> list[Problem]:
        try:
            resolved = resolve_variant(base, variant, run_id, loader)
        except ToolkitError as err:
            return [_typed(p) for p in err.problems]
        return list(validate_resolved(resolved))

    return check


def _typed(p: Problem) -> Problem:
    if p.rule_id is None:
        p.rule_id = "profile.type"
    return p


def promote(
    state: SweepState,
    base: ResolvedProfile,
    *,
    by: str = "throughput",
    name: str | None = None,
    run_ref: str,
    pick: int | None = None,
    knob_reasons: Mapping[str, str] | None = None,
    tool: str = "sweep",
) -> tuple[str, str, RankedRow]:
    """(name, text, the winning row) of the promoted profile. `run_ref` is how the why cites the run.

    `pick` promotes that variant instead of the ranking's first (a tune keeps the best that beat the noise band,
    which need not be the first by a hair); `knob_reasons` adds, per changed knob, how the run arrived at it (a
    tune's verdict and step); `tool` names the command in the text (sweep or tune)."""
    rows = ranking(state, by)
    if not rows:
        raise ToolkitError.of(
            f"{tool} {state.run_id} has no measured variant to promote",
            field="--promote",
            fix=f"resume the {tool} until at least one variant is measured (toolkit {tool} --resume RUN)",
        )
    best = rows[0]
    if pick is not None:
        best = next((r for r in rows if r.variant_index == pick), best)
    variant = state.variant(best.variant_index).variant
    spec = base_spec(base)
    changed = changed_knobs(spec, variant)
    if not changed:
        raise ToolkitError.of(
            f"the best variant {best.variant_id} ({best.label}) is the base profile {base.name} itself",
            field="--promote",
            fix=f"nothing to promote: {base.name} already has the measured-best values",
        )
    window = "steady-state" if best.throughput_window == "steady" else "over the full run (no steady window found)"
    slo = ",".join(f"{k}={v:g}" for k, v in (state.capacity["slo"] if state.capacity else {}).items())
    held = state.capacity is not None and \
        capacity.result(state, state.variant(best.variant_index)).status == capacity.HELD
    # A tokens-per-joule candidate is measured at the rate it is held to, not searched up to its own capacity.
    rate_is = "the rate the candidates were held to, SLO met:" if held else "the highest rate that met the SLO"
    under = f" at {best.request_rate:g} req/s, {rate_is} {slo}" if best.request_rate else ""
    metric = (
        f"{best.steady_output_tok_per_s:,.0f} output tok/s {window}"
        if by == "throughput"
        else f"goodput {best.steady_output_tok_per_s:,.0f} output tok/s{under}"
        if by == "goodput"
        else f"{best.tokens_per_j:.3f} output tok/J{under}"
    )
    ranked = {"throughput": "steady-state throughput", "goodput": "goodput under the SLO"}.get(by, "tokens per joule")
    by = "throughput" if by == "goodput" else by  # compared with the base by its output tok/s from here on
    baseline = _base_row(state, spec, rows)
    why: dict[str, dict[str, str]] = {}
    for path, value in changed.items():
        old = spec_value(spec, path)
        reason = (knob_reasons or {}).get(path, "")
        place = "first" if best.rank == 1 else str(best.rank)
        reason += (
            f"{tool} {state.run_id}: {best.variant_id} ({best.label}) ranked {place} of {len(rows)} by {ranked}: "
            f"{metric}{'' if best.request_rate else f' at concurrency {best.concurrency}'}"
        )
        if best.tokens_per_j is not None and by == "throughput":
            reason += f", {best.tokens_per_j:.3f} tok/J"
        reason += (f"; {path.rsplit('.', 1)[-1]} {'unset' if old is None else format_value(old)} in {base.name} -> "
                   f"{format_value(value)}")
        if baseline is not None and by == "throughput":
            gain = (best.steady_output_tok_per_s / baseline.steady_output_tok_per_s - 1) * 100
            reason += (
                f" ({baseline.variant_id}, the base's values, measured {baseline.steady_output_tok_per_s:,.0f} "
                f"tok/s: {gain:+.1f} %)"
            )
        elif baseline is not None and best.tokens_per_j and baseline.tokens_per_j:
            gain = (best.tokens_per_j / baseline.tokens_per_j - 1) * 100
            reason += (
                f" ({baseline.variant_id}, the base's values, measured {baseline.tokens_per_j:.3f} tok/J: "
                f"{gain:+.1f} %; throughput {best.steady_output_tok_per_s:,.0f} against "
                f"{baseline.steady_output_tok_per_s:,.0f} tok/s)"
            )
        reason += f". Data: {mark(best.provenance, detail=True)}."
        why[path] = {"reason": reason, "link": run_ref}
    promoted = name or f"{base.name}-{state.run_id.removeprefix(base.name + '-')}-{best.variant_id}".lower()
    header = [
        f"Promoted by `toolkit {tool} --promote` from {tool} {state.run_id}, variant {best.variant_id}.",
        f"The {tool}'s state and report: {run_ref}",
    ]
    text = variant_profile_text(
        base=base.name,
        name=promoted,
        knobs=changed,
        description=(
            f"{base.name} with the best variant of {tool} {state.run_id} ({best.label}): {metric}"
            f"{'' if best.request_rate else f' at concurrency {best.concurrency}'} "
            f"({mark(best.provenance, detail=True)})."
        ),
        why=why,
        header=header,
    )
    return promoted, text, best


def spec_value(spec: Mapping[str, Any], path: str) -> Any:
    node: Any = spec
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _base_row(state: SweepState, spec: Mapping[str, Any], rows: list[RankedRow]) -> RankedRow | None:
    """The measured variant whose knobs all equal the base's values, if the sweep included it."""
    for row in rows:
        if not changed_knobs(spec, state.variant(row.variant_index).variant):
            return row
    return None
