"""Memory terms of a step's phases beside the activations and the gradients (parallel.cost.peak
adds them up): what a rank holds in every phase (RoPE tables, pipeline receive buffers), the
collective buffers of a unit's backward, the embedding's dense gradient under tp, and AdamW's
temporaries. Torch-free; each measured on gloo ranks (tests/distributed/
test_activation_memory.py) and checked by hand in tests/unit/test_step_peak.py.

Each term takes the views it reads (memory_views.py) and is memoised on them; the
`(spec, rank)` functions below them are the same terms for one rank of a RunSpec.
"""
from __future__ import annotations

from functools import lru_cache

from conf.spec import ModelSpec, PrecisionSpec, RunSpec
from parallel.cost.activations import DTYPE_BYTES, pipeline_in_flight
from parallel.cost.kept_activations import stage_output_bytes
from parallel.cost.memory_static import (
    ep_block_elements, ep_layer_elements, fsdp_copy_bytes, holding, stage_elements,
)
from parallel.cost.memory_views import (
    CACHE, Holds, Place, Regime, Sharding, Stages, rank_place, spec_views,
)
from parallel.cost.params import fsdp_local_numel, sharded_numel, tp_local_shape
from parallel.dims import pipeline_stage_ids, zero1_owners

GRAD_BYTES = 4
ROPE_TABLES = 3
"""The Llama module (training/models/llama/model.py) registers cos, sin and signed sin,
[max_seq_len, head_dim] fp32 each."""


def rope_table_bytes(model: ModelSpec, p) -> int:
    """The RoPE tables of a rank's model parts (one per pipeline stage it runs); `p`: its
    ParallelSpec (or memory_views.Stages)."""
    parts = p.pp_virtual_stages if p.pp > 1 else 1
    return parts * ROPE_TABLES * model.max_seq_len * model.head_dim * GRAD_BYTES


@lru_cache(maxsize=CACHE)
def pipeline_buffers(*, model: ModelSpec, stages: Stages, regime: Regime, pp_rank: int) -> int:
    """A pipeline rank's receive buffers beyond the inputs of its chunks in flight (those are
    the first block's inputs, counted with the activations): per micro-batch, one for the
    input of each of its stages but the first, one for the output's gradient of each but the
    last, each a stage output (activations.stage_output_bytes_per_token)."""
    s = stages
    if s.pp == 1:
        return 0
    ids = pipeline_stage_ids(pp=s.pp, virtual_stages=s.pp_virtual_stages, pp_rank=pp_rank)
    m = s.pp_microbatches
    receiving = sum(1 for i in ids if i != 0)
    sending = sum(1 for i in ids if i != s.n_stages - 1)
    chunks = pipeline_in_flight(s, pp_rank)
    held_inputs = chunks - (min(chunks, m) if 0 in ids else 0)
    per_buffer = stage_output_bytes(model, last=False, tokens=regime.tokens,
                                    dtypes=regime.dtypes, split=regime.split)
    return per_buffer * (m * (receiving + sending) - held_inputs)


def collective_buffers(*, model: ModelSpec, stages: Stages, tp: int, fsdp: bool, zero: int,
                       precision: PrecisionSpec, pp_rank: int, ep: int = 1) -> int:
    """Bytes of collective buffers alive during one unit's backward.
    FSDP: the reduce-scatter's input, the unit's whole gradient in the reduce dtype, and
    under zero=3 the all-gather output (compute dtype, whole over the shards) of the next
    unit, prefetched while this one runs, where the rank holds a next block (measured on gloo
    ranks: the unit in use, the prefetched unit's all-gather output and the head unit); the
    unit in use has been copied out of its own buffer (freed) into its parameters, which are
    the weight copies (memory_static.weight_copies). DDP: none beyond the gradients (its
    buckets are the gradients, gradient_as_bucket_view). TP: none beyond the activations
    (its gathers are what the matmuls keep, counted there). EP: a block's experts are the
    rank's E/ep."""
    if not fsdp:
        return 0
    largest = block_elements(model=model, tp=tp, shards=1, index=0, ep=ep)
    reduce = DTYPE_BYTES[precision.reduce_dtype.value] * largest
    gather = DTYPE_BYTES[precision.compute_dtype.value] * largest
    layers = holding(model=model, holds=stages.holds, tp=tp, pp_rank=pp_rank).layers
    return reduce + (gather if zero == 3 and len(layers) > 1 else 0)  # a next block


def layer_buffer_savings(*, model: ModelSpec, layers: tuple[int, ...], tp: int, fsdp: bool,
                         zero: int, precision: PrecisionSpec, ep: int) -> tuple[int, ...]:
    """Per block of `layers`: how much less than `collective_buffers` (sized by the largest
    block) its backward holds under ep, where blocks differ (a dense block beside MoE
    blocks whose experts are the rank's E/ep): its own reduce-scatter input and the next
    unit's gather (the block before it) at their own sizes. All 0 without ep: every
    block's buffers are the largest's."""
    if not fsdp or ep == 1:
        return (0,) * len(layers)
    largest = block_elements(model=model, tp=tp, shards=1, index=0, ep=ep)
    reduce = DTYPE_BYTES[precision.reduce_dtype.value]
    gather = DTYPE_BYTES[precision.compute_dtype.value] if zero == 3 and len(layers) > 1 else 0
    own = [ep_layer_elements(model, layer=layer, tp=tp, ep=ep) for layer in layers]
    prefetched = [own[max(0, j - 1)] if j else own[0] for j in range(len(layers))]
    return tuple(reduce * (largest - mine) + gather * (largest - before)
                 for mine, before in zip(own, prefetched))


def pipeline_grad_reduce(*, model: ModelSpec, stages: Stages, tp: int, zero: int,
                         precision: PrecisionSpec, pp_rank: int) -> int:
    """A pipeline rank under FSDP at its stage's REDUCE_GRAD, beyond its parameters, optimizer
    state and weight copies: torch's schedules run every micro-batch's backward with gradient
    sync and re-sharding off (torch.distributed.pipelining PipelineStage
    backward_maybe_with_nosync), so by then every unit of the stage is gathered (compute
    dtype; the weight copies count `fsdp_copy_bytes` of them) and every gradient is whole,
    accumulated in the reduce dtype; the reduce-scatter then copies one unit at a time into
    its input buffer. Activations are gone by then."""
    held = holding(model=model, holds=stages.holds, tp=tp, pp_rank=pp_rank)
    elements = stage_elements(model, held)
    compute = DTYPE_BYTES[precision.compute_dtype.value]
    reduce = DTYPE_BYTES[precision.reduce_dtype.value]
    copies = fsdp_copy_bytes(model=model, holds=stages.holds, schedule=stages.pp_schedule,
                             tp=tp, zero=zero, compute_bytes=compute)[pp_rank]
    largest = block_elements(model=model, tp=tp, shards=1, index=0)
    return (reduce + compute) * elements - copies + reduce * largest


@lru_cache(maxsize=CACHE)
def block_elements(*, model: ModelSpec, tp: int, shards: int, index: int, ep: int = 1,
                   expert_shards: int = 1) -> int:
    """Elements of one block's parameters on a rank (every block is alike, an FSDP unit of
    its own): tp-local, in FSDP shard `index` of `shards`; under ep the rank's experts
    (memory_static.ep_block_elements)."""
    if ep > 1:
        return ep_block_elements(model, tp=tp, ep=ep, shards=shards, index=index,
                                 expert_shards=expert_shards)
    return sum(fsdp_local_numel(local, shards=shards, index=index)
               for _, _, local in _one_block(model, tp))


def _one_block(model: ModelSpec, tp: int) -> tuple:
    whole = Holds(1, 1, (model.n_layers,))
    return holding(model=model, holds=whole, tp=tp, pp_rank=0).block


def embedding_grad_transient(*, model: ModelSpec, tp: int, fsdp: bool,
                             precision: PrecisionSpec, pp_rank: int) -> int:
    """The embedding's backward under tp, on the rank that holds it: a dense gradient over
    the whole vocabulary (`embedding_dense_backward`, [vocab, dim], in the weight's dtype),
    of which the rank's vocabulary shard is then copied out as its gradient (measured on
    gloo ranks); it is the last op of the backward. Without tp the dense gradient is the
    gradient itself."""
    if tp == 1 or pp_rank != 0:
        return 0
    weight = DTYPE_BYTES[precision.compute_dtype.value] if fsdp else GRAD_BYTES
    return weight * model.vocab_size * model.dim


def optimizer_transient(*, model: ModelSpec, stages: Stages, sharding: Sharding,
                        regime: Regime, precision: PrecisionSpec, place: Place) -> int:
    """AdamW's temporaries beyond its state, by the kernel training/optim.py `implementation`
    picks (per parameter group: the matrices, then the vectors; sizes are the rank's FSDP
    shards, tp-local; under ZeRO-1 the tensors the rank owns):
    - CUDA: the fused kernel, none; the bf16-state AdamW (training/adamw_bf16.py): not counted;
    - CPU, foreach (the parameters are all plain tensors or all DTensors of one mesh): one
      list the size of the group's second moments (`_foreach_sqrt`; the rest is in place);
    - CPU, torch's single-tensor loop (a mix: tp without sequence parallelism leaves the
      norms plain beside tp's DTensors): per parameter, `exp_avg_sq.sqrt()` and its quotient
      by the bias correction alive together beside the previous parameter's `denom`."""
    if not _cpu_adamw(regime.device, precision):
        return 0
    foreach = _foreach(sharding.tp, regime.split.sequence_parallel)
    return GRAD_BYTES * _adamw_peak(model=model, holds=stages.holds, sharding=sharding,
                                    place=place, foreach=foreach)


@lru_cache(maxsize=CACHE)
def _adamw_peak(*, model: ModelSpec, holds: Holds, sharding: Sharding, place: Place,
                foreach: bool) -> int:
    """The rank steps only what it owns under ZeRO-1 (parallel.dims.zero1_owners over the
    held tensors' tp-local sizes, as memory_static.zero1_shares)."""
    held = holding(model=model, holds=holds, tp=sharding.tp, pp_rank=place.pp_rank).tensors
    sizes = [(len(shape), sharded_numel(name, tp_local_shape(name, shape, sharding.tp,
                                                             model.family),
                                        family=model.family, shards=sharding.shards,
                                        index=place.shard, ep=sharding.ep,
                                        expert_shards=sharding.expert_shards))
             for name, shape in held]
    owner = zero1_owners([size for _, size in sizes], sharding.owners)
    sizes = [entry for entry, rank in zip(sizes, owner) if rank == place.owner]
    groups = ([n for dims, n in sizes if dims >= 2], [n for dims, n in sizes if dims < 2])
    if foreach:
        return max(sum(group) for group in groups)
    return max((previous + 2 * current for group in groups
                for previous, current in zip([0, *group], group)), default=0)


def _foreach(tp: int, sequence_parallel: bool) -> bool:
    return not (tp > 1 and not sequence_parallel)


def _cpu_adamw(device: str, precision: PrecisionSpec) -> bool:
    return device != "cuda" and precision.optimizer_state_dtype.value != "bf16"


def adamw_foreach(spec: RunSpec) -> bool:
    """Does training/optim.py `implementation` give a CPU run foreach AdamW? Yes unless the
    parameters mix plain tensors and DTensors: tp > 1 without sequence parallelism (its norms
    stay plain; measured on gloo ranks for tp and fsdp+tp, with and without SP)."""
    return _foreach(spec.parallel.tp, spec.parallel.sequence_parallel)


def cpu_adamw(spec: RunSpec) -> bool:
    """Does the run's AdamW make temporaries (optimizer_transient_bytes)?"""
    return _cpu_adamw(spec.training.device, spec.precision)


# The terms for one rank of a RunSpec.

def activation_kwargs(spec: RunSpec, rank: int) -> dict:
    """What activations.activation_bytes needs of a rank, besides its layers: one
    micro-batch's tokens (its pipeline micro-batch, its cp share), dtypes and split."""
    return spec_views(spec).phase.kwargs()


def resident_bytes(spec: RunSpec, rank: int) -> int:
    """Bytes a rank holds through the whole step besides parameters, gradients and optimizer
    state: each of its model parts' RoPE tables (non-persistent fp32 buffers, one set per
    pipeline stage), and the receive buffers torch's PipelineStage allocates once and
    reuses (`pipeline_buffer_bytes`)."""
    return rope_table_bytes(spec.model, spec.parallel) + pipeline_buffer_bytes(spec, rank)


def pipeline_buffer_bytes(spec: RunSpec, rank: int) -> int:
    views = spec_views(spec)
    return pipeline_buffers(model=spec.model, stages=views.stages, regime=views.phase,
                            pp_rank=rank_place(spec, rank).pp_rank)


def embedding_grad_transient_bytes(spec: RunSpec, rank: int) -> int:
    sharding = spec_views(spec).sharding
    return embedding_grad_transient(model=spec.model, tp=sharding.tp, fsdp=sharding.fsdp,
                                    precision=spec.precision,
                                    pp_rank=rank_place(spec, rank).pp_rank)


def optimizer_transient_bytes(spec: RunSpec, rank: int) -> int:
    views = spec_views(spec)
    return optimizer_transient(model=spec.model, stages=views.stages, sharding=views.sharding,
                               regime=views.phase, precision=spec.precision,
                               place=rank_place(spec, rank))
