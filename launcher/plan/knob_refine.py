"""The knobs `plan --search` turns beyond the layout: on each of the top layouts, compile
(training.compile=true) and fp8 (precision=fp8, where the device and the layout allow it),
alone and together, each variant composed, resolved and planned like any run (a variant a
rule refuses, or one that changes nothing the plan predicts, is left out); then the top is
re-ranked over layouts and variants together, so
a layout with compile or fp8 shows as its own row, with `why` against the new #1.

Only the top layouts are refined, not every one: each knob multiplies the layouts to plan,
and on the rows the search ranks the knobs move every layout by about the same factor
(benchmarks/plan_search_time.py keeps the search's wall time in view). A base that sets a
knob keeps it: the variants only turn knobs on."""
from __future__ import annotations

from dataclasses import replace

from conf.compose import compose_many
from conf.errors import ConfigError
from conf.hf_model_config import explicit_model_keys
from conf.resolve import resolve
from conf.spec import RunSpec
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


def refine(result: SearchResult, overrides: list[str], base: RunSpec, *, global_batch_size: int,
           point_overrides, top: int) -> SearchResult:
    """`result` with its top re-ranked over its layouts and their knob variants."""
    variants = knob_variants(base)
    if not variants or not result.top:
        return result
    jobs = [(r, v) for r in result.top for v in variants]
    lists = [[*overrides, *point_overrides(r.candidate), *v,
              f"training.global_batch_size={global_batch_size}"] for r, v in jobs]
    found = list(result.top)
    for (r, v), cfg, every in zip(jobs, compose_many(lists), lists):
        spec = _resolved(cfg, base, every)
        if spec is not None:
            plan = make_plan(spec)
            prediction = predict(spec, plan)
            if plan.verdict.fits is not False and _changes(prediction, plan, r):
                found.append(Ranked(candidate=r.candidate, spec=spec, plan=plan,
                                    prediction=prediction, extra=v))
    found.sort(key=lambda r: (-(r.prediction.tokens_per_s_per_device or 0.0),
                              r.plan.memory.total))
    entries = [(r.candidate, r.spec, r.plan, r.prediction) for r in found]
    ranked = [replace(r, why=why(i, r.prediction, r.plan, entries))
              for i, r in enumerate(found[:top])]
    return replace(result, top=ranked,
                   predicted_tps=tuple(sorted((*result.predicted_tps, *(
                       r.prediction.tokens_per_s_per_device or 0.0 for r in found
                       if r.extra)), reverse=True)))


def _changes(prediction, plan, layout: Ranked) -> bool:
    """A variant is kept only when the knob changes what the plan predicts for its layout
    (faster, or less memory): a knob the cost model does not see would only repeat it."""
    tps = prediction.tokens_per_s_per_device or 0.0
    base = layout.prediction.tokens_per_s_per_device or 0.0
    return tps > base * (1 + 1e-9) or plan.memory.total < layout.plan.memory.total


def _resolved(cfg, base: RunSpec, every: list[str]) -> RunSpec | None:
    if isinstance(cfg, ConfigError):
        return None
    try:
        return resolve(cfg, host=base.host, check_paths=False,
                       explicit=explicit_model_keys(every))
    except ConfigError:
        return None
