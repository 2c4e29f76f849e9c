"""A step's fullest moment on one rank, by phase. Torch-free.

Beyond what a rank holds throughout (fp32 parameters, optimizer state, and the weight copies
held from forward to backward), a step holds, at each of its moments:
- the loss (backward's start): every kept activation, the loss's transient, and the
  gradients only where they outlive a step (`grads_outlive_backward`); elsewhere
  `zero_grad(set_to_none=True)` dropped them and backward makes them anew;
- each block's backward, the last block first: the activations still kept (the head's and
  the later blocks' are freed), the block's recompute working set, the gradients made so far
  (the head's and the later blocks'), and the collective buffers of the unit in flight;
- the optimizer step: every gradient, and AdamW's temporaries (`optimizer_transient_bytes`);
- the embedding's backward, under tp its dense whole-vocabulary gradient;
- a pipeline rank under FSDP: its stage's gradient reduce, every unit gathered and every
  gradient whole until then (`pipeline_grad_reduce`);
- in every phase, what stays resident (`resident_bytes`: RoPE tables, pipeline buffers).
Under expert parallelism an MoE block's units gather and reduce the rank's E/ep experts, and
each block's backward holds its own and the next block's buffers at their sizes
(step_memory_terms.layer_buffer_savings), not the largest block's.
The terms beside activations and gradients are in parallel/cost/step_memory_terms.py. A pipeline
rank has no one order of backwards: its backward phase holds every chunk in flight and the
gradients (less one chunk without a steady state, `pipeline_steady`) and the largest block
working set.
Measured against the ranks' real storages in tests/distributed/test_activation_memory.py.
`phase_terms_of` takes the views it reads (memory_views.py) and is memoised on them; the
counts it is given are the rank's (memory.py adds them up).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from conf.spec import ModelSpec, PrecisionSpec, RecomputeSpec, RunSpec
from parallel.cost.activations import activation_bytes, pipeline_in_flight
from parallel.cost.kept_activations import NO_RECOMPUTE, end_kept_bytes
from parallel.cost.memory_static import holding
from parallel.cost.memory_views import CACHE, Place, Regime, Stages, Views
from parallel.cost.memory_views import rank_place, spec_views
from parallel.cost.step_memory_terms import (
    GRAD_BYTES,
    block_elements,
    collective_buffers,
    embedding_grad_transient,
    layer_buffer_savings,
    optimizer_transient,
    pipeline_buffers,
    pipeline_grad_reduce,
    rope_table_bytes,
)


def grads_outlive_backward(spec: RunSpec) -> bool:
    """Are gradients alive before backward starts? Under DDP (its buckets are the gradients:
    gradient_as_bucket_view, and the buckets stay between steps), with pipeline stages
    (micro-batches' backwards interleave with later forwards) and with gradient
    accumulation (the second micro-batch's forward runs over the first's gradients)."""
    views = spec_views(spec)
    return _outlive(ddp=views.sharding.ddp, pipeline=views.stages.pp > 1,
                    accumulates=views.accumulates)


def _outlive(*, ddp: bool, pipeline: bool, accumulates: bool) -> bool:
    return ddp or pipeline or accumulates


def block_numel(spec: RunSpec, rank: int, *, sharded: bool) -> int:
    """Elements of one block's parameters on `rank` (every block is alike, an FSDP unit of
    its own): tp-local, and FSDP-sharded when `sharded`."""
    sharding, place = spec_views(spec).sharding, rank_place(spec, rank)
    if not sharded:
        return block_elements(model=spec.model, tp=sharding.tp, shards=1, index=0,
                              ep=sharding.ep)
    return block_elements(model=spec.model, tp=sharding.tp, shards=sharding.shards,
                          index=place.shard, ep=sharding.ep,
                          expert_shards=sharding.expert_shards)


def collective_buffer_bytes(spec: RunSpec, rank: int) -> int:
    """Bytes of collective buffers alive during one unit's backward
    (step_memory_terms.collective_buffers)."""
    views = spec_views(spec)
    return collective_buffers(model=spec.model, stages=views.stages, tp=views.sharding.tp,
                              fsdp=views.sharding.fsdp, zero=views.sharding.zero,
                              precision=spec.precision, pp_rank=rank_place(spec, rank).pp_rank,
                              ep=views.sharding.ep)


def recompute_working_set_bytes(spec: RunSpec, layer: int, kwargs: dict) -> int:
    """What block `layer`'s backward re-creates at once: the activations it keeps without
    recompute less those its policy keeps (one block's full activations under full
    recompute; nothing without recompute, or under offload on a CPU device)."""
    return _one_block(spec.model, spec.recompute, layer, **kwargs)[1]


def _block_bytes_of(model: ModelSpec, recompute: RecomputeSpec, layers, regime: Regime
                    ) -> dict[int, tuple[int, int]]:
    """(kept, recompute working set) of each block in `layers`; blocks differ only in whether
    the policy applies to them and whether they hold experts, so each kind is computed once."""
    def kind(layer: int) -> tuple[bool, bool]:
        return recompute.applies_to(layer), model.is_moe_block(layer)

    first = {kind(layer): layer for layer in reversed(layers)}
    by_kind = {key: _one_block(model, recompute, layer, **regime.kwargs())
               for key, layer in first.items()}
    return {layer: by_kind[kind(layer)] for layer in layers}


@lru_cache(maxsize=CACHE)
def _one_block(model: ModelSpec, recompute: RecomputeSpec, layer: int, **kwargs
               ) -> tuple[int, int]:
    one = dict(layers=[layer], with_head=False, with_embedding=False, **kwargs)
    kept = activation_bytes(model, recompute=recompute, **one)
    return kept, activation_bytes(model, recompute=NO_RECOMPUTE, **one) - kept


def step_phase_bytes(spec: RunSpec, rank: int, *, grads: int, optimizer: int,
                     activations: int, loss_peak: int) -> dict[str, int]:
    """Bytes alive at each phase (module docstring) beyond parameters, optimizer state and
    weight copies; `grads`, `optimizer`, `activations`, `loss_peak`: the rank's bytes
    (memory.static_bytes, layout_activation_bytes, loss_peak_bytes_of)."""
    terms = phase_terms(spec, rank)
    phases, base = terms.phases(grads=grads, optimizer=optimizer, activations=activations,
                                loss_peak=loss_peak)
    if terms.pipeline:
        phases["backward"] = base + terms.walk.peak
    else:
        phases.update({f"backward layers.{layer}": base + extra
                       for layer, extra in terms.walk.by_layer})
    return phases


def step_peak_bytes(spec: RunSpec, rank: int, **counts: int) -> int:
    """The fullest phase of `step_phase_bytes` (without listing every block's)."""
    return phase_terms(spec, rank).peak(**counts)


@dataclass(frozen=True, slots=True)
class PhaseTerms:
    """What a rank's step phases add to its byte counts (gradients, optimizer state, kept
    activations, the loss's transient): the same for every rank of a layout with equal
    pipeline stage and FSDP shard, whatever the counts - so a search computes it once."""

    grads_held: bool
    """Gradients exist at the loss: grads_outlive_backward, but for a pipeline rank without
    a steady state (`pipeline_steady`) only under DDP or gradient accumulation."""
    optimizer_transient: int
    """optimizer_transient_bytes."""
    pipeline: bool
    buffers: int
    head: int
    """The head's kept activations (freed before the blocks' backward; 0 with pp)."""
    block_grads: int
    """Gradient bytes of the rank's blocks together (0 with pp)."""
    walk: "_Walk"
    resident: int = 0
    """resident_bytes: held in every phase."""
    embedding_grad: int = 0
    """embedding_grad_transient_bytes."""
    chunks: int = 1
    """Pipeline chunks in flight (activations.pipeline_in_flight)."""
    grad_reduce: int = 0
    """A pipeline rank under FSDP: what its stage's REDUCE_GRAD holds
    (step_memory_terms.pipeline_grad_reduce); 0 otherwise."""
    steady: bool = True
    """A pipeline rank runs a forward after a backward while all its chunks are in flight
    (`pipeline_steady`); else its first backward frees a chunk before the gradients exist.
    Not taken under FSDP: there (pp2_dp2 on gloo ranks) the first stage's peak came with
    every chunk held, timing-dependent (1.08-1.115 x the reduced figure)."""

    def phases(self, *, grads: int, optimizer: int, activations: int, loss_peak: int
               ) -> tuple[dict[str, int], int]:
        """(the loss's and the optimizer step's phases, what every block's backward holds)."""
        held = grads if self.grads_held else 0
        phases = {"loss": self.resident + held + activations + loss_peak,
                  "optimizer step": self.resident + grads + self.optimizer_transient}
        if self.pipeline:  # backwards interleave with forwards: no one order to walk
            # with no forward after a backward while all chunks are in flight, the first
            # backward has freed a chunk by the time the gradients exist
            freed = 0 if self.steady else activations // self.chunks
            base = self.resident + grads + activations - freed + self.buffers
            phases["backward embedding"] = base + self.embedding_grad
            if self.grad_reduce:
                phases["gradient reduce"] = self.resident + self.grad_reduce
            return phases, base
        phases["backward embedding"] = self.resident + grads + self.buffers + self.embedding_grad
        made = held or grads - self.block_grads  # the root's: embedding, norm, head
        return phases, self.resident + activations - self.head + made + self.buffers

    def peak(self, **counts: int) -> int:
        phases, base = self.phases(**counts)
        return max(*phases.values(), base + self.walk.peak)


def pipeline_steady(p, pp_rank: int) -> bool:
    """Does pipeline rank `pp_rank` reach a steady state, a forward after a backward while
    all its chunks are in flight (1F1B with more micro-batches than its warm-up)? If not
    (GPipe, or every chunk's forward in the warm-up), its fullest moment, the first
    backward, comes before any gradient exists. `p`: a ParallelSpec (or Stages)."""
    return pipeline_in_flight(p, pp_rank) < p.pp_microbatches * p.pp_virtual_stages


def phase_terms(spec: RunSpec, rank: int) -> PhaseTerms:
    """PhaseTerms of `rank` (module docstring)."""
    return phase_terms_of(model=spec.model, views=spec_views(spec), precision=spec.precision,
                          recompute=spec.recompute, place=rank_place(spec, rank))


def phase_terms_of(*, model: ModelSpec, views: Views, precision: PrecisionSpec,
                   recompute: RecomputeSpec, place: Place) -> PhaseTerms:
    """PhaseTerms of the rank at `place` (module docstring)."""
    return phase_rows(model=model, views=views, precision=precision, recompute=recompute,
                      places=(place,))[0]


def phase_rows(*, model: ModelSpec, views: Views, precision: PrecisionSpec,
               recompute: RecomputeSpec, places: tuple[Place, ...]) -> tuple[PhaseTerms, ...]:
    """PhaseTerms of the ranks at `places`. What they read of a rank's FSDP shard and ZeRO-1
    owner (its blocks' gradients, AdamW's temporaries) is summed first, so the rest is
    memoised without them (layouts that split their data-parallel ranks otherwise share it)."""
    stages, sharding = views.stages, views.sharding
    ranks = tuple((place.pp_rank, 0 if stages.pp > 1 else GRAD_BYTES * block_elements(
        model=model, tp=sharding.tp, shards=sharding.shards, index=place.shard,
        ep=sharding.ep, expert_shards=sharding.expert_shards),
        optimizer_transient(model=model, stages=stages, sharding=sharding,
                            regime=views.phase, precision=precision, place=place))
        for place in places)
    return _phase_rows(model=model, stages=stages, regime=views.phase, tp=sharding.tp,
                       fsdp=sharding.fsdp, zero=sharding.zero, ddp=sharding.ddp,
                       accumulates=views.accumulates, precision=precision,
                       recompute=recompute, ranks=ranks, ep=sharding.ep)


@lru_cache(maxsize=CACHE)
def _phase_rows(*, model: ModelSpec, stages: Stages, regime: Regime, tp: int, fsdp: bool,
                zero: int, ddp: bool, accumulates: bool, precision: PrecisionSpec,
                recompute: RecomputeSpec, ranks: tuple[tuple[int, int, int], ...], ep: int = 1
                ) -> tuple[PhaseTerms, ...]:
    """`ranks`: (pipeline rank, one block's gradient bytes: 0 with pp, AdamW's temporaries)."""
    return tuple(_phase_terms(model=model, stages=stages, regime=regime, tp=tp, fsdp=fsdp,
                              zero=zero, ddp=ddp, accumulates=accumulates, precision=precision,
                              recompute=recompute, pp_rank=pp_rank, block_grads=block_grads,
                              optimizer_transient=transient, ep=ep)
                 for pp_rank, block_grads, transient in ranks)


@lru_cache(maxsize=CACHE)
def _phase_terms(*, model: ModelSpec, stages: Stages, regime: Regime, tp: int, fsdp: bool,
                 zero: int, ddp: bool, accumulates: bool, precision: PrecisionSpec,
                 recompute: RecomputeSpec, pp_rank: int, block_grads: int,
                 optimizer_transient: int, ep: int = 1) -> PhaseTerms:
    """`block_grads`: one block's gradient bytes on the rank (0 with pp)."""
    pipeline = stages.pp > 1
    steady = not pipeline or pipeline_steady(stages, pp_rank)
    held = _outlive(ddp=ddp, pipeline=pipeline and steady, accumulates=accumulates)
    layers = holding(model=model, holds=stages.holds, tp=tp, pp_rank=pp_rank).layers
    savings = layer_buffer_savings(model=model, layers=layers, tp=tp, fsdp=fsdp, zero=zero,
                                   precision=precision, ep=ep)
    walk = _walk(model, recompute, layers, None if pipeline else 0 if held else block_grads,
                 regime, savings)
    resident = (rope_table_bytes(model, stages)
                + pipeline_buffers(model=model, stages=stages, regime=regime, pp_rank=pp_rank))
    return PhaseTerms(
        grads_held=held, optimizer_transient=optimizer_transient, pipeline=pipeline,
        buffers=collective_buffers(model=model, stages=stages, tp=tp, fsdp=fsdp, zero=zero,
                                   precision=precision, pp_rank=pp_rank, ep=ep),
        head=0 if pipeline else end_kept_bytes(model=model, regime=regime, recompute=recompute,
                                               head=True),
        block_grads=block_grads * len(layers), walk=walk, resident=resident,
        chunks=pipeline_in_flight(stages, pp_rank), steady=steady or fsdp,
        grad_reduce=pipeline_grad_reduce(model=model, stages=stages, tp=tp, zero=zero,
                                         precision=precision, pp_rank=pp_rank)
        if pipeline and fsdp else 0,
        embedding_grad=embedding_grad_transient(model=model, tp=tp, fsdp=fsdp,
                                                precision=precision, pp_rank=pp_rank))


@dataclass(frozen=True, slots=True)
class _Walk:
    by_layer: tuple[tuple[int, int], ...]
    """(layer, bytes its backward adds to what every block's backward holds)."""
    peak: int


@lru_cache(maxsize=CACHE)
def _walk(model: ModelSpec, recompute: RecomputeSpec, layers: tuple[int, ...],
          grad_step: int | None, regime: Regime, savings: tuple[int, ...] = ()) -> _Walk:
    """Backward, the last block first: block i's backward holds its recompute working set,
    less the kept activations of the later blocks (freed), plus the gradients those made
    (`grad_step` per block; 0 when the gradients are held all along). `grad_step` None: a
    pipeline stage, with no one order - the largest working set."""
    buffer_savings = dict(zip(layers, savings))
    spec_blocks = _block_bytes_of(model, recompute, layers, regime)
    if grad_step is None:
        peak = max((w for _, w in spec_blocks.values()), default=0)
        return _Walk(by_layer=(), peak=peak)
    out, freed, made = [], 0, 0
    for layer in reversed(layers):
        block_kept, working = spec_blocks[layer]
        out.append((layer, working - freed + made - buffer_savings.get(layer, 0)))
        freed += block_kept
        made += grad_step
    return _Walk(by_layer=tuple(out), peak=max((extra for _, extra in out), default=0))
