"""Terms of a step's phases beside the activations and the gradients (parallel.cost.peak
adds them up): what a rank holds in every phase (RoPE tables, pipeline receive buffers), the
embedding's dense gradient under tp, and AdamW's temporaries. Torch-free; each measured on
gloo ranks (tests/distributed/test_activation_memory.py) and checked by hand in
tests/unit/test_step_peak.py."""
from __future__ import annotations

from functools import lru_cache

from conf.spec import ModelSpec, RunSpec
from parallel.cost.activations import (
    DTYPE_BYTES,
    ActivationSplit,
    activation_dtypes,
    pipeline_in_flight,
    stage_output_bytes_per_token,
)
from parallel.cost.params import fsdp_local_numel, held_parameters, tp_local_shape
from parallel.dims import ParallelDims, pipeline_stage_ids, zero1_owners

GRAD_BYTES = 4


def activation_kwargs(spec: RunSpec, rank: int) -> dict:
    """What activations.activation_bytes needs of a rank, besides its layers: one
    micro-batch's tokens (its pipeline micro-batch, its cp share), dtypes and split."""
    p, t = spec.parallel, spec.training
    dims = ParallelDims.from_spec(p)
    micro_batch = t.micro_batch_size // p.pp_microbatches
    return dict(tokens=micro_batch * t.seq_len // p.cp, micro_batch=micro_batch,
                device_type=t.device, split=ActivationSplit.of(p, loss_chunks=t.loss_chunks),
                dtypes=activation_dtypes(spec.precision, uses_fsdp=dims.uses_fsdp))


ROPE_TABLES = 3
"""The Llama module (training/models/llama/model.py) registers cos, sin and signed sin,
[max_seq_len, head_dim] fp32 each."""


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


def optimizer_transient_bytes(spec: RunSpec, rank: int) -> int:
    """AdamW's temporaries beyond its state, by the kernel training/optim.py `implementation`
    picks (per parameter group: the matrices, then the vectors; sizes are the rank's FSDP
    shards, tp-local; under ZeRO-1 the tensors the rank owns):
    - CUDA: the fused kernel, none; the bf16-state AdamW (training/adamw_bf16.py): not counted;
    - CPU, foreach (the parameters are all plain tensors or all DTensors of one mesh): one
      list the size of the group's second moments (`_foreach_sqrt`; the rest is in place);
    - CPU, torch's single-tensor loop (a mix: tp without sequence parallelism leaves the
      norms plain beside tp's DTensors): per parameter, `exp_avg_sq.sqrt()` and its quotient
      by the bias correction alive together beside the previous parameter's `denom`."""
    if not cpu_adamw(spec):
        return 0
    dims = ParallelDims.from_spec(spec.parallel)
    coords = dims.coordinates(rank)
    shards, index = (dims.dp_shard * dims.cp, coords["dp_shard"] * dims.cp + coords["cp"]) \
        if dims.uses_fsdp else (1, 0)
    owners = (dims.dp_shard, coords["dp_shard"]) if dims.zero == 1 and dims.uses_ddp else (1, 0)
    return GRAD_BYTES * _adamw_peak(spec.model, tuple(held_parameters(spec, coords["pp"])),
                                    tp=dims.tp, shards=shards, index=index, owners=owners,
                                    foreach=adamw_foreach(spec))


@lru_cache(maxsize=256)
def _adamw_peak(model: ModelSpec, held: tuple, *, tp: int, shards: int, index: int,
                owners: tuple[int, int], foreach: bool) -> int:
    """`owners`: (ZeRO-1 owners, this rank's index): the rank steps only what it owns
    (parallel.dims.zero1_owners over the held tensors' tp-local sizes, as memory.py)."""
    sizes = [(len(shape), fsdp_local_numel(tp_local_shape(name, shape, tp, model.family),
                                           shards=shards,
                                           index=index)) for name, shape in held]
    n, mine = owners
    owner = zero1_owners([size for _, size in sizes], n)
    sizes = [entry for entry, rank in zip(sizes, owner) if rank == mine]
    groups = ([n for dims, n in sizes if dims >= 2], [n for dims, n in sizes if dims < 2])
    if foreach:
        return max(sum(group) for group in groups)
    return max((previous + 2 * current for group in groups
                for previous, current in zip([0, *group], group)), default=0)


def adamw_foreach(spec: RunSpec) -> bool:
    """Does training/optim.py `implementation` give a CPU run foreach AdamW? Yes unless the
    parameters mix plain tensors and DTensors: tp > 1 without sequence parallelism (its norms
    stay plain; measured on gloo ranks for tp and fsdp+tp, with and without SP)."""
    return not (spec.parallel.tp > 1 and not spec.parallel.sequence_parallel)


def cpu_adamw(spec: RunSpec) -> bool:
    """Does the run's AdamW make temporaries (optimizer_transient_bytes)?"""
    return (spec.training.device != "cuda"
            and spec.precision.optimizer_state_dtype.value != "bf16")
