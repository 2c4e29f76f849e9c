"""`meshrun plan --search --rank-of "OVERRIDES"`: where a given layout (a published one, say)
ranks among the layouts the search finds, and why: its predicted tokens/s against #1's and
the step-time terms that differ most between the two, or, when it does not fit, what it needs
against what a device has and its largest memory terms."""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from conf.compose import compose_config
from conf.hf_model_config import explicit_model_keys
from conf.resolve import resolve
from conf.spec import RunSpec
from parallel.cost.devices import GIB
from parallel.cost.plan import Plan, make_plan
from parallel.cost.rank_terms import decided_by
from parallel.cost.search import SearchResult
from parallel.cost.step_time import estimate_time

MEMORY_TERMS = ("params", "grads", "optimizer", "weight_copies", "activations", "loss_peak")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankOf:
    overrides: list[str]
    spec: RunSpec
    plan: Plan
    tokens_per_s: float | None
    rank: int | None
    """1 = best; None when it does not fit."""
    of: int
    """Fitting layouts the search found (the compile/fp8 variants knob_refine kept count
    toward the rank, not here)."""
    why: str

    @property
    def line(self) -> str:
        where = (f"ranks #{self.rank} of {self.of} fitting layouts" if self.rank is not None
                 else "is dropped by the search")
        tps = "" if self.tokens_per_s is None else f", {self.tokens_per_s:,.0f} tokens/s/device"
        return (f"--rank-of {' '.join(self.overrides)}: {where} "
                f"({self.plan.memory.total / GIB:.1f} GiB{tps}); {self.why}")

    def as_json(self) -> dict:
        return {"overrides": self.overrides, "rank": self.rank, "of": self.of,
                "memory_bytes": self.plan.memory.total, "fits": self.plan.verdict.fits,
                "tokens_per_s_per_device": self.tokens_per_s, "why": self.why}


def rank_overrides(text: str) -> list[str]:
    return shlex.split(text)


def target_spec(overrides: list[str], extra: list[str], *, host, global_batch_size: int
                ) -> RunSpec:
    """The layout to rank: the search's overrides, then `extra`, at the search's batch (one
    sequence per micro-batch unless `extra` says otherwise, as the search's base)."""
    given = {o.split("=", 1)[0].lstrip("+~") for o in [*overrides, *extra]}
    batch = [f"{key}={value}" for key, value in (("training.micro_batch_size", 1),
                                                 ("training.grad_accum_steps", -1))
             if key not in given]
    every = [*overrides, *batch, *extra, f"training.global_batch_size={global_batch_size}"]
    return resolve(compose_config(every), host=host, check_paths=False,
                   explicit=explicit_model_keys(every))


def rank_of(spec: RunSpec, extra: list[str], result: SearchResult) -> RankOf:
    plan = make_plan(spec)
    estimate = estimate_time(spec, plan)
    tps = None if estimate is None else estimate.tokens_per_s_per_device
    fits = plan.verdict.fits is not False
    rank = result.rank_of(tps or 0.0) if fits else None
    if not fits:
        why = _memory_why(plan)
    elif not result.top or estimate is None:
        why = "no layout of the search to compare with"
    else:
        why = _time_why(estimate, result.top[0])
    return RankOf(overrides=extra, spec=spec, plan=plan, tokens_per_s=tps, rank=rank,
                  of=result.fits, why=why)


def _memory_why(plan: Plan) -> str:
    m, v = plan.memory, plan.verdict
    largest = sorted(((getattr(m, k), k) for k in MEMORY_TERMS), reverse=True)[:3]
    terms = ", ".join(f"{k.replace('_', ' ')} {b / GIB:.1f} GiB" for b, k in largest)
    return (f"does not fit: needs {v.need_bytes / GIB:.1f} GiB > "
            f"{(v.usable_bytes or 0) / GIB:.1f} GiB usable; largest: {terms}")


def _time_why(estimate, best) -> str:
    """The terms that decided: this layout's step-time terms against #1's, the largest
    differences first, in milliseconds per step (parallel.cost.rank_terms)."""
    theirs = estimate_time(best.spec, best.plan)
    if theirs is None:
        return "no time model for #1"
    gap = 1 - estimate.tokens_per_s_per_device / theirs.tokens_per_s_per_device
    terms = decided_by(estimate.breakdown, theirs.breakdown)
    head = (f"{gap:.0%} slower than #1" if gap > 0.0005 else
            "faster than #1" if gap < -0.0005 else "ties #1")
    return f"{head}; against #1, per step: {terms or 'no term differs'}"
