"""`meshrun plan --search`: every layout resolve() accepts for a model on a cluster, those that
fit ranked by predicted tokens/s per device. Torch-free, no Hydra.

The candidates come from parallel.cost.search_space (resolve()'s own rules). Each is costed
with the functions `meshrun plan` uses, memoised by the pieces they read, since thousands of
candidates share them:
- static bytes and weight copies per rank (memory.static_bytes, weight_copy_bytes) depend on
  the degrees, the ZeRO stage and the stages per rank, not on the batch or recompute;
- activations per pipeline rank (memory.layout_activation_bytes) not on dp or ZeRO;
- the ranks among which the fullest is (memory.representative_ranks) on the degrees alone.
Those that do not fit (fit.memory_verdict) are dropped and counted; the rest are ranked by
step_time.estimate_time through `predict` (one adapter: a changed signature is a one-line fix),
and the top ones are re-planned with make_plan itself, so what is shown is what `meshrun plan`
prints for that point.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields, replace

from conf.schema import RecomputeConfig, RunConfig
from conf.spec import ParallelSpec, RunSpec
from parallel.cost.devices import GIB
from parallel.cost.fit import memory_verdict
from parallel.cost.memory import (
    MemoryEstimate, layout_activation_bytes, loss_peak_bytes_of, representative_ranks,
    static_bytes, weight_copy_bytes,
)
from parallel.cost.peak import step_peak_bytes
from parallel.cost.plan import Plan, make_plan
from parallel.cost.search_space import Candidate, enumerate_candidates
from parallel.cost.step_time import Hardware, estimate_time, hardware_of
from parallel.dims import ParallelDims

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Ranked:
    candidate: Candidate
    spec: RunSpec
    plan: Plan
    prediction: Prediction
    why: str = ""


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

    @property
    def dropped_line(self) -> str:
        if self.usable_bytes is None:
            return "no memory verdict on this device (none dropped)"
        if not self.does_not_fit:
            return "every layout resolve() accepts fits"
        usable = (f" > {self.usable_bytes / GIB:.1f} GiB usable"
                  if self.usable_bytes is not None else "")
        return (f"does not fit: {self.does_not_fit} layouts (the smallest needs "
                f"{self.smallest_misfit_bytes / GIB:.1f} GiB{usable})")


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
                                           estimate.step_s))


OVERHEADS = {"bubble_s": "pipeline bubble", "comm_exposed_s": "exposed comm",
             "overhead_s": "per-layer overhead", "recompute_s": "recompute",
             "optimizer_s": "optimizer"}
"""The parts of a step-time breakdown (step_time.StepBreakdown) `why` names, as it names them;
comm_s (hidden or not) and compute_s are left out: they are not a cost beyond the matmuls."""


def _overheads(breakdown, step_s: float) -> tuple[tuple[str, float], ...]:
    """The largest non-matmul parts of a step, as shares of it (OVERHEADS names them)."""
    if breakdown is None or not step_s:
        return ()
    parts = [(label, getattr(breakdown, name, 0.0) / step_s)
             for name, label in OVERHEADS.items() if getattr(breakdown, name, 0.0) > 0]
    return tuple(sorted(parts, key=lambda part: -part[1]))


_ACTIVATION_FIELDS = tuple(f.name for f in fields(ParallelSpec)
                           if f.name not in ("name", "dp_replicate", "dp_shard", "zero"))
"""What activations may read of the layout: all but the data-parallel split and ZeRO."""


class MemoryTable:
    """Per-rank bytes of candidates, memoised by the pieces each memory function reads."""

    def __init__(self) -> None:
        self._static: dict[tuple, list] = {}
        self._activations: dict[tuple, dict[str, int]] = {}
        self._copies: dict[tuple, int] = {}
        self._in_step: dict[tuple, int] = {}

    def peak(self, candidate: Candidate, base: RunSpec) -> MemoryEstimate:
        """What estimate_memory(candidate.spec(base)) returns: the fullest representative
        rank (the spec is built only when a piece is not memoised yet)."""
        spec = _Lazy(candidate, base)
        p = candidate.parallel
        # uses_fsdp: FSDP mixed precision keeps activations in another dtype regime.
        layout = (*(getattr(p, name) for name in _ACTIVATION_FIELDS), p.uses_fsdp,
                  candidate.micro_batch_size, candidate.recompute)
        return max((self._estimate(spec, rank, static, self._activations_of(layout, spec, pp_rank))
                    for pp_rank, rank, static in self._static_of(spec)),
                   key=lambda memory: memory.total)

    def _estimate(self, spec: _Lazy, rank: int, static, activations: dict) -> MemoryEstimate:
        """One rank's estimate; the step's fullest phase (peak.step_peak_bytes) memoised by
        what it reads of the candidate (its sections) and the byte counts it is given."""
        c = spec.candidate
        key = (c.parallel, c.micro_batch_size, c.grad_accum_steps, c.recompute, rank,
               static.grads, static.optimizer, activations["activations"],
               activations["loss_peak"])
        if key not in self._in_step:
            self._in_step[key] = step_peak_bytes(spec.spec, rank, grads=static.grads,
                                                 optimizer=static.optimizer, **activations)
        return MemoryEstimate(params=static.params, grads=static.grads,
                              optimizer=static.optimizer, master_weights=0,
                              weight_copies=self._copies_of(spec, rank),
                              in_step=self._in_step[key], **activations)

    def _static_of(self, spec: _Lazy) -> list:
        """(pp rank, rank, static bytes) of each representative rank."""
        key = static_key(spec.candidate.parallel)
        if key not in self._static:
            dims, spec = ParallelDims.from_spec(spec.candidate.parallel), spec.spec
            self._static[key] = [(dims.coordinates(rank)["pp"], rank, static_bytes(spec, rank))
                                 for rank in representative_ranks(spec)]
        return self._static[key]

    def _copies_of(self, spec: _Lazy, rank: int) -> int:
        """Weight copies `rank` holds: the static layout's, and whether recompute frees
        autocast's copies (memory.autocast_keeps_copy)."""
        key = (static_key(spec.candidate.parallel), spec.candidate.recompute, rank)
        if key not in self._copies:
            self._copies[key] = weight_copy_bytes(spec.spec, rank)
        return self._copies[key]

    def _activations_of(self, layout: tuple, spec: _Lazy, pp_rank: int) -> dict[str, int]:
        """Activation bytes pipeline rank `pp_rank` keeps and its loss peak; `layout`: what
        they read of the candidate (_ACTIVATION_FIELDS, FSDP or not, micro-batch, recompute)."""
        key = (layout, pp_rank)
        if key not in self._activations:
            rank = ParallelDims.from_spec(spec.candidate.parallel).rank_of(
                {"pp": pp_rank, "dp_replicate": 0, "dp_shard": 0, "cp": 0, "tp": 0})
            self._activations[key] = {
                "activations": layout_activation_bytes(spec.spec, rank),
                "loss_peak": loss_peak_bytes_of(spec.spec, rank)}
        return self._activations[key]


class _Lazy:
    """A candidate's spec, built on first use."""

    def __init__(self, candidate: Candidate, base: RunSpec) -> None:
        self.candidate, self.base, self._spec = candidate, base, None

    @property
    def spec(self) -> RunSpec:
        if self._spec is None:
            self._spec = self.candidate.spec(self.base)
        return self._spec


def static_key(p: ParallelSpec) -> tuple:
    """What static_bytes and weight_copy_bytes read of a layout: the blocks a pipeline rank
    holds (pp, virtual stages), tp, the ZeRO stage, FSDP or DDP, and over how many ranks the
    state is split (dp_shard x cp under FSDP, dp_shard under ZeRO-1). Layouts with one key
    hold the same bytes on each pipeline rank's representative ranks
    (tests/unit/test_plan_search.py compares every sampled candidate with estimate_memory)."""
    shards = (p.dp_shard * p.cp if p.uses_fsdp
              else p.dp_shard if p.zero == 1 and p.uses_ddp else 1)
    return (p.pp, p.pp_virtual_stages, p.tp, p.zero, p.uses_fsdp, p.uses_ddp, shards)


def search(cfg: RunConfig, base: RunSpec, *, global_batch_size: int,
           policies: dict[str, RecomputeConfig], top: int = 10) -> SearchResult:
    """The `top` fitting layouts for `cfg`'s model and cluster (resolved into `base`) at
    `global_batch_size` sequences per step, best predicted tokens/s per device first."""
    rejected: Counter = Counter()
    table = MemoryTable()
    base_plan = make_plan(base)
    hardware = hardware_of(base)  # the cluster's constants: the same for every candidate
    fitting, enumerated, misfits, smallest, usable = [], 0, 0, None, None
    for candidate in enumerate_candidates(cfg, base, global_batch_size=global_batch_size,
                                          policies=policies, rejected=rejected):
        enumerated += 1
        memory = table.peak(candidate, base)
        verdict = memory_verdict(base, memory.total)  # reads only the device: the base's
        usable = verdict.usable_bytes
        if verdict.fits is False:
            misfits += 1
            smallest = memory.total if smallest is None else min(smallest, memory.total)
            continue
        spec = candidate.spec(base)
        tokens = spec.training.tokens_per_step  # the candidate's batch, not the base's
        plan = replace(base_plan, dp=spec.parallel.dp, memory=memory, verdict=verdict,
                       tokens_per_step=tokens, flops_per_step=float(base_plan.flops_per_token)
                       * tokens, total_tokens=tokens * spec.training.steps)
        fitting.append((candidate, spec, plan, predict(spec, plan, hardware)))
    fitting.sort(key=_rank_key)
    ranked = [_replanned(c, spec, i, fitting) for i, (c, spec, _, _) in
              enumerate(fitting[:top])]
    basis = fitting[0][3].basis if fitting else "nothing fits"
    return SearchResult(top=ranked, enumerated=enumerated, fits=len(fitting),
                        does_not_fit=misfits, smallest_misfit_bytes=smallest,
                        usable_bytes=usable, rejected=rejected, basis=basis)


def _rank_key(entry) -> tuple:
    """Most tokens/s per device first; among equals, the least memory (the most headroom)."""
    _, _, plan, prediction = entry
    return (-(prediction.tokens_per_s_per_device or 0.0), plan.memory.total)


def _replanned(candidate: Candidate, spec: RunSpec, index: int, fitting: list) -> Ranked:
    plan = make_plan(spec)
    prediction = predict(spec, plan)
    return Ranked(candidate=candidate, spec=spec, plan=plan, prediction=prediction,
                  why=why(index, prediction, plan, fitting))


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
        parts.append(f"{gap:.0%} slower than #1" if gap > 0.0005
                     else "ties #1 on time, less headroom")
    parts += [f"{name} {share:.0%}" for name, share in prediction.overheads[:2]]
    if plan.verdict.margin_bytes is not None:
        parts.append(f"headroom {plan.verdict.margin_bytes / GIB:.1f} GiB")
    return "; ".join(parts)
