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
- in every phase, what stays resident (`resident_bytes`: RoPE tables, pipeline buffers).
The terms beside activations and gradients are in parallel/cost/step_terms.py. A pipeline
rank has no one order of backwards: its backward phase holds every chunk in flight and the
gradients (less one chunk without a steady state, `pipeline_steady`) and the largest block
working set.
Measured against the ranks' real storages in tests/distributed/test_activation_memory.py.
The function is pure in the spec sections it reads (model, parallel, precision, recompute,
training) and the per-rank byte counts it is given, so a search may memoise it by them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from conf.schema import RecomputeMode
from conf.spec import ModelSpec, RecomputeSpec, RunSpec
from parallel.cost.activations import DTYPE_BYTES, activation_bytes, pipeline_in_flight
from parallel.cost.params import fsdp_local_numel, held_layers, parameter_shapes, tp_local_shape
from training.models.family import block_index
from parallel.cost.step_terms import (
    GRAD_BYTES,
    activation_kwargs,
    embedding_grad_transient_bytes,
    optimizer_transient_bytes,
    resident_bytes,
)
from parallel.dims import ParallelDims

NO_RECOMPUTE = RecomputeSpec(mode=RecomputeMode.none)


def grads_outlive_backward(spec: RunSpec) -> bool:
    """Are gradients alive before backward starts? Under DDP (its buckets are the gradients:
    gradient_as_bucket_view, and the buckets stay between steps), with pipeline stages
    (micro-batches' backwards interleave with later forwards) and with gradient
    accumulation (the second micro-batch's forward runs over the first's gradients)."""
    dims = ParallelDims.from_spec(spec.parallel)
    return dims.uses_ddp or dims.pp > 1 or spec.training.grad_accum_steps > 1


def block_numel(spec: RunSpec, rank: int, *, sharded: bool) -> int:
    """Elements of one block's parameters on `rank` (every block is alike, an FSDP unit of
    its own): tp-local, and FSDP-sharded when `sharded`."""
    dims = ParallelDims.from_spec(spec.parallel)
    coords = dims.coordinates(rank)
    if not (sharded and dims.uses_fsdp):
        return _block_numel(spec.model, tp=dims.tp, shards=1, index=0)
    return _block_numel(spec.model, tp=dims.tp, shards=dims.dp_shard * dims.cp,
                        index=coords["dp_shard"] * dims.cp + coords["cp"])


@lru_cache(maxsize=256)
def _block_numel(model: ModelSpec, *, tp: int, shards: int, index: int) -> int:
    return sum(fsdp_local_numel(tp_local_shape(name, shape, tp, model.family), shards=shards,
                                index=index)
               for name, shape in parameter_shapes(model) if block_index(name) == 0)


def collective_buffer_bytes(spec: RunSpec, rank: int) -> int:
    """Bytes of collective buffers alive during one unit's backward.
    FSDP: the reduce-scatter's input, the unit's whole gradient in the reduce dtype, and
    under zero=3 the all-gather output (compute dtype, whole over the shards) of the next
    unit, prefetched while this one runs, where the rank holds a next block (measured on gloo ranks: the unit in use, the
    prefetched unit's all-gather output and the head unit); the unit in use has been copied
    out of its own buffer (freed) into its parameters, which are the weight copies
    (memory.weight_copy_bytes). DDP: none beyond the gradients (its buckets are the
    gradients, gradient_as_bucket_view). TP: none beyond the activations (its gathers are
    what the matmuls keep, counted there)."""
    dims = ParallelDims.from_spec(spec.parallel)
    if not dims.uses_fsdp:
        return 0
    largest = block_numel(spec, rank, sharded=False)
    reduce = DTYPE_BYTES[spec.precision.reduce_dtype.value] * largest
    gather = DTYPE_BYTES[spec.precision.compute_dtype.value] * largest
    prefetches = len(held_layers(spec, dims.coordinates(rank)["pp"])) > 1  # a next block
    return reduce + (gather if dims.zero == 3 and prefetches else 0)


def recompute_working_set_bytes(spec: RunSpec, layer: int, kwargs: dict) -> int:
    """What block `layer`'s backward re-creates at once: the activations it keeps without
    recompute less those its policy keeps (one block's full activations under full
    recompute; nothing without recompute, or under offload on a CPU device)."""
    return _block_bytes_of(spec.model, spec.recompute, [layer], kwargs)[layer][1]


def _block_bytes_of(model: ModelSpec, recompute: RecomputeSpec, layers, kwargs: dict
                    ) -> dict[int, tuple[int, int]]:
    """(kept, recompute working set) of each block in `layers`; blocks differ only in whether
    the policy applies to them, so each kind is computed once."""
    first = {recompute.applies_to(layer): layer for layer in reversed(layers)}
    by_policy = {applies: _one_block(model, recompute, layer, **kwargs)
                 for applies, layer in first.items()}
    return {layer: by_policy[recompute.applies_to(layer)] for layer in layers}


@lru_cache(maxsize=1024)
def _one_block(model: ModelSpec, recompute: RecomputeSpec, layer: int, **kwargs
               ) -> tuple[int, int]:
    one = dict(layers=[layer], with_head=False, with_embedding=False, **kwargs)
    kept = activation_bytes(model, recompute=recompute, **one)
    return kept, activation_bytes(model, recompute=NO_RECOMPUTE, **one) - kept


@lru_cache(maxsize=1024)
def _head_bytes(model: ModelSpec, recompute: RecomputeSpec, **kwargs) -> int:
    return activation_bytes(model, recompute=recompute, layers=[], with_embedding=False,
                            **kwargs)


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
    backward, comes before any gradient exists."""
    return pipeline_in_flight(p, pp_rank) < p.pp_microbatches * p.pp_virtual_stages


def phase_terms(spec: RunSpec, rank: int) -> PhaseTerms:
    """PhaseTerms of `rank` (module docstring)."""
    p = spec.parallel
    pp_rank = ParallelDims.from_spec(p).coordinates(rank)["pp"]
    pipeline = p.pp > 1
    steady = not pipeline or pipeline_steady(p, pp_rank)
    held = grads_outlive_backward(spec) if steady else (
        ParallelDims.from_spec(p).uses_ddp or spec.training.grad_accum_steps > 1)
    kwargs = activation_kwargs(spec, rank)
    layers = tuple(held_layers(spec, pp_rank))
    block_grads = 0 if pipeline else GRAD_BYTES * block_numel(spec, rank, sharded=True)
    walk = _walk(spec.model, spec.recompute, layers,
                 None if pipeline else 0 if held else block_grads,
                 tuple(sorted(kwargs.items())))
    return PhaseTerms(
        grads_held=held, optimizer_transient=optimizer_transient_bytes(spec, rank),
        pipeline=pipeline, buffers=collective_buffer_bytes(spec, rank),
        head=0 if pipeline else _head_bytes(spec.model, spec.recompute, **kwargs),
        block_grads=block_grads * len(layers), walk=walk,
        resident=resident_bytes(spec, rank), chunks=pipeline_in_flight(p, pp_rank),
        steady=steady or ParallelDims.from_spec(p).uses_fsdp, embedding_grad=embedding_grad_transient_bytes(spec, rank))


@dataclass(frozen=True, slots=True)
class _Walk:
    by_layer: tuple[tuple[int, int], ...]
    """(layer, bytes its backward adds to what every block's backward holds)."""
    peak: int


@lru_cache(maxsize=4096)
def _walk(model: ModelSpec, recompute: RecomputeSpec, layers: tuple[int, ...],
          grad_step: int | None, kwargs: tuple) -> _Walk:
    """Backward, the last block first: block i's backward holds its recompute working set,
    less the kept activations of the later blocks (freed), plus the gradients those made
    (`grad_step` per block; 0 when the gradients are held all along). `grad_step` None: a
    pipeline stage, with no one order - the largest working set."""
    spec_blocks = _block_bytes_of(model, recompute, layers, dict(kwargs))
    if grad_step is None:
        peak = max((w for _, w in spec_blocks.values()), default=0)
        return _Walk(by_layer=(), peak=peak)
    out, freed, made = [], 0, 0
    for layer in reversed(layers):
        block_kept, working = spec_blocks[layer]
        out.append((layer, working - freed + made))
        freed += block_kept
        made += grad_step
    return _Walk(by_layer=tuple(out), peak=max((extra for _, extra in out), default=0))
