"""`meshrun plan --search`: every layout resolve() accepts for a model on a cluster, those that
fit ranked by predicted tokens/s per device. Torch-free, no Hydra.

The candidates come from parallel.cost.search_space (resolve()'s own rules). Each one's
memory is the plan's own (parallel.cost.memory.LayoutMemory of its spec sections, whose
terms are memoised on what each reads; a layout whose floor cannot fit is skipped before
its step's phases are summed). Those that do not fit
(fit.memory_verdict's rule) are dropped and counted; the rest are ranked by
step_time.estimate_time through `predict` (one adapter: a changed signature is a one-line fix),
and the top ones are re-planned with make_plan itself, so what is shown is what `meshrun plan`
prints for that point. Only the layouts that can reach the top are predicted: a layout whose
step-time floor (step_time.step_floor_s: compute and its bubble) caps its tokens/s below the
`top`-th best predicted cannot rank there (for llama3_70b on 1,024 H100s about 2,700 of 9,200
fitting layouts are predicted; tests/unit/test_search_ranking.py compares the top layouts
with predicting every one).
"""
from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, replace

from conf.errors import ProblemList
from conf.rules.split_rules import check_loss_chunks
from conf.schema import RecomputeConfig, RunConfig
from conf.spec import RunSpec
from parallel.cost.devices import GIB
from parallel.cost.fit import memory_verdict
from parallel.cost.memory import LayoutMemory
from parallel.cost.optimizer_state import uses_muon
from parallel.cost.plan import Plan, make_plan
from parallel.cost.rank_terms import decided_by
from parallel.cost.search_space import Candidate, enumerate_candidates
from parallel.cost.step_time import Hardware, estimate_time, hardware_of, step_floor_s

FALLBACK_BASIS = ("no time model for this device (estimate_time gave none): ranked by "
                  "memory headroom only")


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    step_s: float | None
    tokens_per_s_per_device: float | None
    mfu: float | None
    basis: str
    """Where the numbers come from (the time model, or FALLBACK_BASIS)."""
    overheads: tuple[tuple[str, float], ...] = ()
    """(what, fraction of the step) beyond compute, largest first, when the model says."""
    breakdown: object = None
    """The step-time model's StepBreakdown, when it gave one (what `why` compares)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranked:
    candidate: Candidate
    spec: RunSpec
    plan: Plan
    prediction: Prediction
    why: str = ""
    extra: tuple[str, ...] = ()
    """Overrides beyond the candidate's layout (the knobs the refinement turned on:
    training.compile=true, precision=fp8)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchResult:
    top: list[Ranked]
    enumerated: int
    """Candidates resolve()'s rules accepted."""
    fits: int
    does_not_fit: int
    smallest_misfit_bytes: int | None
    """Of those that do not fit, the least any needs."""
    usable_bytes: float | None
    rejected: Counter
    """Combinations the rules dropped, by rule key."""
    basis: str
    predicted_tps: tuple[float, ...] = ()
    """Tokens/s per device of every fitting layout predicted (every one that can reach the
    top, and with `also_above` every one that can beat it): what a rank is counted against."""

    def rank_of(self, tokens_per_s: float) -> int:
        """The rank a layout of `tokens_per_s` takes among the fitting ones (1 = best)."""
        return 1 + sum(tps > tokens_per_s for tps in self.predicted_tps)

    @property
    def dropped_line(self) -> str:
        if self.usable_bytes is None:
            return "no memory verdict on this device (none dropped)"
        if not self.does_not_fit:
            return "every layout resolve() accepts fits"
        return (f"does not fit: {self.does_not_fit} layouts (the smallest needs "
                f"{self.smallest_misfit_bytes / GIB:.2f} GiB > "
                f"{self.usable_bytes / GIB:.2f} GiB usable per rank)")


def predict(spec: RunSpec, plan: Plan, hardware: Hardware | None = None) -> Prediction:
    """The time model's step time, tokens/s per device and MFU (the one call into
    parallel.cost.step_time); FALLBACK_BASIS where it has no answer. `hardware`: the
    cluster's constants, read once per search (None: read them from `spec`)."""
    estimate = estimate_time(spec, plan, hardware=hardware)
    if estimate is None:
        return Prediction(step_s=None, tokens_per_s_per_device=None, mfu=None,
                          basis=FALLBACK_BASIS)
    per_device = getattr(estimate, "tokens_per_s_per_device", None)
    if per_device is None:
        per_device = plan.tokens_per_step / estimate.step_s / plan.world_size
    mfu = getattr(estimate, "mfu", None)
    if mfu is None and getattr(estimate, "peak", None) is not None:
        mfu = plan.flops_per_step / (estimate.step_s * plan.world_size * estimate.peak.flops)
    return Prediction(step_s=estimate.step_s, tokens_per_s_per_device=per_device, mfu=mfu,
                      basis="parallel.cost.step_time.estimate_time",
                      overheads=_overheads(getattr(estimate, "breakdown", None),
                                           estimate.step_s),
                      breakdown=getattr(estimate, "breakdown", None))


OVERHEADS = {"bubble_s": "pipeline bubble", "comm_exposed_s": "exposed comm",
             "overhead_s": "per-layer overhead", "recompute_s": "recompute",
             "optimizer_s": "optimizer", "offload_s": "host offload"}
"""The parts of a step-time breakdown (step_time.StepBreakdown) `why` names, as it names them;
comm_s (hidden or not) and compute_s are left out: they are not a cost beyond the matmuls."""


def _overheads(breakdown, step_s: float) -> tuple[tuple[str, float], ...]:
    """The largest non-matmul parts of a step, as shares of it (OVERHEADS names them)."""
    if breakdown is None or not step_s:
        return ()
    parts = [(label, getattr(breakdown, name, 0.0) / step_s)
             for name, label in OVERHEADS.items() if getattr(breakdown, name, 0.0) > 0]
    return tuple(sorted(parts, key=lambda part: -part[1]))


def search(cfg: RunConfig, base: RunSpec, *, global_batch_size: int,
           policies: dict[str, RecomputeConfig], top: int = 10,
           also_above: float | None = None) -> SearchResult:
    """The `top` fitting layouts for `cfg`'s model and cluster (resolved into `base`) at
    `global_batch_size` sequences per step, best predicted tokens/s per device first;
    `also_above`: predict as well every layout that could beat this many tokens/s per device
    (so SearchResult.rank_of counts them all)."""
    rejected: Counter = Counter()
    base_plan = make_plan(base)
    hardware = hardware_of(base)  # the cluster's constants: the same for every candidate
    usable = memory_verdict(base, 0).rank_budget_bytes  # the device's (or a CPU rank's share)
    fitting, enumerated, misfits, smallest, trainings = [], 0, 0, None, {}
    for candidate in enumerate_candidates(cfg, base, global_batch_size=global_batch_size,
                                          policies=policies, rejected=rejected):
        enumerated += 1
        layout = LayoutMemory(model=base.model, parallel=candidate.parallel,
                              training=candidate.training(base, trainings),
                              precision=base.precision, recompute=candidate.recompute,
                              document_mask=base.data.document_mask, muon=uses_muon(base.optim))
        chunked = None  # the layout with the loss in row blocks, built only when needed
        if usable is not None and smallest is not None and layout.floor() >= max(
                smallest, usable + 1):  # does not fit whole, and cannot be the smallest misfit
            chunked = _in_row_blocks(candidate, base, trainings)
            if chunked is None or chunked[1].floor() >= max(smallest, usable + 1):
                misfits += 1  # nor in row blocks (they only ever take less memory)
                continue
        memory = layout.fullest()
        if usable is not None and memory.total > usable:
            chunked = chunked or _in_row_blocks(candidate, base, trainings)
            if chunked and chunked[1].fullest().total <= usable:
                candidate, memory = chunked[0], chunked[1].fullest()
        if usable is not None and memory.total > usable:  # memory_verdict's rule
            misfits += 1
            smallest = memory.total if smallest is None else min(smallest, memory.total)
            continue
        verdict = memory_verdict(base, memory.total)
        spec = candidate.spec(base, trainings)
        tokens = spec.training.tokens_per_step  # the candidate's batch, not the base's
        plan = replace(base_plan, dp=spec.parallel.dp, memory=memory, verdict=verdict,
                       tokens_per_step=tokens, flops_per_step=float(base_plan.flops_per_token)
                       * tokens, total_tokens=tokens * spec.training.steps)
        fitting.append((candidate, spec, plan))
    best = _best(fitting, top, hardware, also_above)
    ranked = [_replanned(c, spec, i, best) for i, (c, spec, _, _) in enumerate(best[:top])]
    basis = best[0][3].basis if best else "nothing fits"
    return SearchResult(top=ranked, enumerated=enumerated, fits=len(fitting),
                        does_not_fit=misfits, smallest_misfit_bytes=smallest,
                        usable_bytes=usable, rejected=rejected, basis=basis,
                        predicted_tps=tuple(e[3].tokens_per_s_per_device or 0.0 for e in best))


SEARCH_LOSS_CHUNKS = 8
"""Row blocks the search gives the head and loss of a layout that does not fit without them
(training.loss_chunks; only the logits' transient shrinks, so a few blocks take most of it)."""


def _in_row_blocks(candidate: Candidate, base: RunSpec, trainings: dict
                   ) -> tuple[Candidate, LayoutMemory] | None:
    """`candidate` with the head and loss in SEARCH_LOSS_CHUNKS row blocks, and its memory,
    when the base runs them whole and training.loss_chunks' rule accepts it; else None."""
    if base.training.loss_chunks != 1:
        return None
    chunked = candidate.with_loss_chunks(SEARCH_LOSS_CHUNKS)
    training = chunked.training(base, trainings)
    problems = ProblemList()
    check_loss_chunks(chunked.parallel, training=training, problems=problems)
    if problems:
        return None
    return chunked, LayoutMemory(model=base.model, parallel=chunked.parallel, training=training,
                                 precision=base.precision, recompute=chunked.recompute,
                                 document_mask=base.data.document_mask,
                                 muon=uses_muon(base.optim))


def _best(fitting: list[tuple], top: int, hardware: Hardware | None,
          also_above: float | None = None) -> list[tuple]:
    """(candidate, spec, plan, prediction) of at least the `top` best of `fitting` in rank
    order (_rank_key; among equals, the order they were found in), predicting only the
    layouts that can be among them: those whose most possible tokens/s per device
    (`_ceiling`) is not below the `top`-th best predicted so far, tried from the highest
    ceiling down. Without a time model every layout gets the fallback prediction."""
    order = range(len(fitting))
    if hardware is not None:
        ceilings = [_ceiling(spec, plan, hardware) for _, spec, plan in fitting]
        order = sorted(order, key=lambda i: -ceilings[i])
    fastest: list[float] = []  # the `top` best tokens/s predicted so far (a min-heap)
    done = []
    for i in order:
        if hardware is not None and len(fastest) == top and ceilings[i] < fastest[0] and (
                also_above is None or ceilings[i] < also_above):
            break  # neither this layout nor any after it can reach the top (or beat also_above)
        candidate, spec, plan = fitting[i]
        prediction = predict(spec, plan, hardware)
        done.append((i, (candidate, spec, plan, prediction)))
        speed = prediction.tokens_per_s_per_device or 0.0
        if len(fastest) < top:
            heapq.heappush(fastest, speed)
        elif speed > fastest[0]:
            heapq.heapreplace(fastest, speed)
    done.sort(key=lambda entry: (_rank_key(entry[1]), entry[0]))
    return [entry for _, entry in done]


def _ceiling(spec: RunSpec, plan: Plan, hardware: Hardware) -> float:
    """The most tokens/s per device `estimate_time` can give the layout: its tokens per step
    over its step-time floor (step_time.step_floor_s) and the ranks, in TimeEstimate's order
    of operations (monotone, so never below what it gives)."""
    floor = step_floor_s(spec, plan, hardware)
    return plan.tokens_per_step / floor / plan.world_size if floor > 0 else float("inf")


def _rank_key(entry) -> tuple:
    """Most tokens/s per device first; among equals, the least memory (the most headroom)."""
    _, _, plan, prediction = entry
    return (-(prediction.tokens_per_s_per_device or 0.0), plan.memory.total)


def _replanned(candidate: Candidate, spec: RunSpec, index: int, fitting: list) -> Ranked:
    plan = make_plan(spec)
    prediction = predict(spec, plan)
    return Ranked(candidate=candidate, spec=spec, plan=plan, prediction=prediction,
                  why=why(index, prediction, plan, fitting))


def _headroom_vs(plan: Plan, best: Plan) -> str:
    if plan.memory.total == best.memory.total:
        return "as much headroom as #1"
    return ("less" if plan.memory.total > best.memory.total else "more") + " headroom than #1"


def why(index: int, prediction: Prediction, plan: Plan, fitting: list) -> str:
    """Why a layout is where it is: its gap to the best, the largest overheads the time
    model names, and its memory headroom."""
    best = fitting[0][3].tokens_per_s_per_device
    parts = []
    if index == 0:
        parts.append("best predicted tokens/s" if best else "most memory headroom")
    elif not best:
        parts.append("less headroom than #1 (no time model)")
    elif prediction.tokens_per_s_per_device is not None:
        gap = 1 - prediction.tokens_per_s_per_device / best
        parts.append(f"{gap:.0%} slower than #1" if gap > 0.0005 else
                     f"ties #1 on time, {_headroom_vs(plan, fitting[0][2])}")
        terms = decided_by(prediction.breakdown, fitting[0][3].breakdown)
        if terms and gap > 0.0005:
            parts.append(f"against #1: {terms}")
    parts += [f"{name} {share:.0%}" for name, share in prediction.overheads[:2]]
    if plan.verdict.margin_bytes is not None:
        parts.append(f"headroom {plan.verdict.margin_bytes / GIB:.1f} GiB")
    return "; ".join(parts)
