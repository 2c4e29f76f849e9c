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
- in every phase, what stays resident (`resident_bytes`: RoPE tables, pipeline buffers).
Measured against the ranks' real storages in tests/distributed/test_activation_memory.py.
The function is pure in the spec sections it reads (model, parallel, precision, recompute,
training) and the per-rank byte counts it is given, so a search may memoise it by them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from conf.schema import RecomputeMode
from conf.spec import ModelSpec, RecomputeSpec, RunSpec
from parallel.cost.activations import (
    DTYPE_BYTES,
    ActivationSplit,
    activation_bytes,
    activation_dtypes,
    pipeline_in_flight,
    stage_output_bytes_per_token,
)
from parallel.cost.params import (
    fsdp_local_numel,
    held_layers,
    held_parameters,
    parameter_shapes,
    tp_local_shape,
)
from parallel.dims import ParallelDims, pipeline_stage_ids

GRAD_BYTES = 4
NO_RECOMPUTE = RecomputeSpec(mode=RecomputeMode.none)


def grads_outlive_backward(spec: RunSpec) -> bool:
    """Are gradients alive before backward starts? Under DDP (its buckets are the gradients:
    gradient_as_bucket_view, and the buckets stay between steps), with pipeline stages
    (micro-batches' backwards interleave with later forwards) and with gradient
    accumulation (the second micro-batch's forward runs over the first's gradients)."""
    dims = ParallelDims.from_spec(spec.parallel)
    return dims.uses_ddp or dims.pp > 1 or spec.training.grad_accum_steps > 1


def activation_kwargs(spec: RunSpec, rank: int) -> dict:
    """What activations.activation_bytes needs of a rank, besides its layers: one
    micro-batch's tokens (its pipeline micro-batch, its cp share), dtypes and split."""
    p, t = spec.parallel, spec.training
    dims = ParallelDims.from_spec(p)
    micro_batch = t.micro_batch_size // p.pp_microbatches
    return dict(tokens=micro_batch * t.seq_len // p.cp, micro_batch=micro_batch,
                device_type=t.device, split=ActivationSplit.of(p),
                dtypes=activation_dtypes(spec.precision, uses_fsdp=dims.uses_fsdp))


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
    return sum(fsdp_local_numel(tp_local_shape(name, shape, tp), shards=shards, index=index)
               for name, shape in parameter_shapes(model) if name.startswith("layers.0."))


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


ROPE_TABLES = 3
"""training/model.py registers cos, sin and signed sin, [max_seq_len, head_dim] fp32 each."""


def resident_bytes(spec: RunSpec, rank: int) -> int:
    """Bytes a rank holds through the whole step besides parameters, gradients and optimizer
    state: each of its model parts' RoPE tables (non-persistent fp32 buffers, one set per
    pipeline stage), and the receive buffers torch's PipelineStage allocates once and
    reuses (`pipeline_buffer_bytes`)."""
    return rope_table_bytes(spec.model, spec.parallel) + pipeline_buffer_bytes(spec, rank)


def rope_table_bytes(model: ModelSpec, p) -> int:
    """The RoPE tables of a rank's model parts (one per pipeline stage it runs)."""
    parts = p.pp_virtual_stages if p.pp > 1 else 1
    return parts * ROPE_TABLES * model.max_seq_len * model.head_dim * GRAD_BYTES


def embedding_grad_transient_bytes(spec: RunSpec, rank: int) -> int:
    """The embedding's backward under tp, on the rank that holds it: a dense gradient over
    the whole vocabulary (`embedding_dense_backward`, [vocab, dim], in the weight's dtype),
    of which the rank's vocabulary shard is then copied out as its gradient (measured on
    gloo ranks); it is the last op of the backward. Without tp the dense gradient is the
    gradient itself."""
    dims = ParallelDims.from_spec(spec.parallel)
    if dims.tp == 1 or dims.coordinates(rank)["pp"] != 0:
        return 0
    weight = DTYPE_BYTES[spec.precision.compute_dtype.value] if dims.uses_fsdp else GRAD_BYTES
    return weight * spec.model.vocab_size * spec.model.dim


def pipeline_buffer_bytes(spec: RunSpec, rank: int) -> int:
    """A pipeline rank's receive buffers beyond the inputs of its chunks in flight (those are
    the first block's inputs, counted with the activations): per micro-batch, one for the
    input of each of its stages but the first, one for the output's gradient of each but the
    last, each a stage output (activations.stage_output_bytes_per_token)."""
    p = spec.parallel
    if p.pp == 1:
        return 0
    pp_rank = ParallelDims.from_spec(p).coordinates(rank)["pp"]
    stages = pipeline_stage_ids(pp=p.pp, virtual_stages=p.pp_virtual_stages, pp_rank=pp_rank)
    m = p.pp_microbatches
    receiving = sum(1 for s in stages if s != 0)
    sending = sum(1 for s in stages if s != p.n_stages - 1)
    chunks = pipeline_in_flight(p, pp_rank)
    held_inputs = chunks - (min(chunks, m) if 0 in stages else 0)
    kwargs = activation_kwargs(spec, rank)
    per_buffer = int(kwargs["tokens"] * stage_output_bytes_per_token(
        spec.model, last=False, dtypes=kwargs["dtypes"], split=kwargs["split"]))
    return per_buffer * (m * (receiving + sending) - held_inputs)


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


def optimizer_transient_bytes(spec: RunSpec, rank: int) -> int:
    """AdamW's temporaries beyond its state. Off CUDA torch 2.13 picks the single-tensor
    AdamW (`_default_to_fused_or_foreach` gives neither fused nor foreach for CPU tensors;
    training/optim.py asks for fused only on CUDA): per parameter, in its group's order
    (training/optim.py: the matrices, then the vectors), `exp_avg_sq.sqrt()` and its quotient
    by the bias correction are alive together, and the previous parameter's `denom` until it
    is replaced: the largest (previous + 2 x current) moment-sized tensors of a group (FSDP
    shards, tp-local; under ZeRO-1 every held tensor, an upper bound of the owned ones).
    CUDA's fused kernel makes none; the bf16-state AdamW (training/adamw_bf16.py) is not
    counted."""
    if not single_tensor_adamw(spec):
        return 0
    dims = ParallelDims.from_spec(spec.parallel)
    coords = dims.coordinates(rank)
    shards, index = (dims.dp_shard * dims.cp, coords["dp_shard"] * dims.cp + coords["cp"]) \
        if dims.uses_fsdp else (1, 0)
    return GRAD_BYTES * _single_tensor_peak(spec.model, tuple(held_parameters(spec, coords["pp"])),
                                            tp=dims.tp, shards=shards, index=index)


@lru_cache(maxsize=256)
def _single_tensor_peak(model: ModelSpec, held: tuple, *, tp: int, shards: int,
                        index: int) -> int:
    sizes = [(len(shape), fsdp_local_numel(tp_local_shape(name, shape, tp), shards=shards,
                                           index=index)) for name, shape in held]
    most = 0
    for group in ([n for dims, n in sizes if dims >= 2], [n for dims, n in sizes if dims < 2]):
        for previous, current in zip([0, *group], group):
            most = max(most, previous + 2 * current)
    return most


def single_tensor_adamw(spec: RunSpec) -> bool:
    """Does the run's AdamW make per-tensor temporaries (optimizer_transient_bytes)?"""
    return (spec.training.device != "cuda"
            and spec.precision.optimizer_state_dtype.value != "bf16")


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
    (`pipeline_steady`)."""

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
        steady=steady, embedding_grad=embedding_grad_transient_bytes(spec, rank))


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
