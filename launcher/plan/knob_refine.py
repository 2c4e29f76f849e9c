"""The knobs `plan --search` turns beyond the layout: on each of the top layouts, compile
(training.compile=true) and fp8 (precision=fp8, where the device allows it), alone and
together, each variant put through the rules resolve() applies to those keys (conf.rules:
check_compile; fp8's device rule by resolving the base once with precision=fp8; fp8 changes
no split, with tp too) and planned like any run. A variant a rule refuses, or one that changes
nothing the plan predicts (the cost model does not see every knob), is left out; then the top
is re-ranked over layouts and variants together, each with `why` against the new #1.

Only the top layouts are refined, not every one: each knob would multiply the layouts to
plan, and the knobs move the layouts the search ranks by about the same factor
(benchmarks/plan_search_time.py keeps the search's wall time in view). A base that sets a
knob keeps it: the variants only turn knobs on."""
from __future__ import annotations

from dataclasses import replace

from conf.compose import compose_config
from conf.errors import ConfigError, ProblemList
from conf.hf_model_config import explicit_model_keys
from conf.resolve import resolve
from conf.rules.compile_rules import check_compile
from conf.schema import RecomputeConfig
from conf.spec import PrecisionSpec, RunSpec
from parallel.cost.plan import make_plan
from parallel.cost.search import Ranked, SearchResult, predict, why

COMPILE = ("training.compile=true",)
FP8 = ("precision=fp8",)


def knob_variants(base: RunSpec) -> list[tuple[str, ...]]:
    """The knob overrides to try on a layout of `base`: those not already on."""
    compile_ = () if base.training.compile else COMPILE
    fp8 = () if base.precision.name.value == "fp8" or base.training.device != "cuda" else FP8
    found = [compile_, fp8, (*compile_, *fp8)]
    return [v for i, v in enumerate(found) if v and v not in found[:i]]


def fp8_precision(overrides: list[str], base: RunSpec, neutral) -> PrecisionSpec | None:
    """The precision section of `base`'s run with precision=fp8, or None where the rules
    refuse fp8 on this device (resolved once; `neutral` gives the search's base layout)."""
    every = [*overrides, *FP8]
    try:
        cfg = neutral(compose_config(every))
        return resolve(cfg, host=base.host, check_paths=False,
                       explicit=explicit_model_keys(every)).precision
    except ConfigError:
        return None


def variant_spec(spec: RunSpec, knobs: tuple[str, ...], *, fp8: PrecisionSpec | None,
                 recompute: RecomputeConfig) -> RunSpec | None:
    """`spec` with `knobs` on, or None when a rule refuses the combination."""
    problems = ProblemList()
    training, precision = spec.training, spec.precision
    if COMPILE[0] in knobs:
        training = replace(training, compile=True)
        check_compile(compile_=True, parallel=spec.parallel, recompute=recompute,
                      problems=problems)
    if FP8[0] in knobs:
        if fp8 is None:
            return None
        precision = fp8  # any layout: fp8 changes no split (tp: parallel/float8_tp.py)
    return None if problems else replace(spec, training=training, precision=precision)


def refine(result: SearchResult, overrides: list[str], base: RunSpec, *, neutral,
           policies: dict[str, RecomputeConfig], top: int) -> SearchResult:
    """`result` with its top re-ranked over its layouts and their knob variants; `neutral`:
    the search's base layout (plan_search.neutral_layout), `policies`: its recompute options."""
    variants = knob_variants(base)
    if not variants or not result.top:
        return result
    fp8 = fp8_precision(overrides, base, neutral) if FP8 in variants else None
    found = list(result.top)
    for r in result.top:
        for knobs in variants:
            spec = variant_spec(r.spec, knobs, fp8=fp8,
                                recompute=policies[r.candidate.recompute_name])
            if spec is None:
                continue
            plan = make_plan(spec)
            prediction = predict(spec, plan)
            if plan.verdict.fits is not False and _changes(prediction, plan, r):
                found.append(Ranked(candidate=r.candidate, spec=spec, plan=plan,
                                    prediction=prediction, extra=knobs))
    found.sort(key=lambda r: (-(r.prediction.tokens_per_s_per_device or 0.0),
                              r.plan.memory.total))
    entries = [(r.candidate, r.spec, r.plan, r.prediction) for r in found]
    ranked = [replace(r, why=why(i, r.prediction, r.plan, entries))
              for i, r in enumerate(found[:top])]
    added = tuple(r.prediction.tokens_per_s_per_device or 0.0 for r in found if r.extra)
    return replace(result, top=ranked, predicted_tps=(*result.predicted_tps, *added))


def _changes(prediction, plan, layout: Ranked) -> bool:
    """A variant is kept only when the knob changes what the plan predicts for its layout
    (faster, or less memory): a knob the cost model does not see would only repeat it."""
    tps = prediction.tokens_per_s_per_device or 0.0
    base = layout.prediction.tokens_per_s_per_device or 0.0
    return tps > base * (1 + 1e-9) or plan.memory.total < layout.plan.memory.total
