"""Bytes per rank under a parallel layout: parameters, gradients, optimizer state, activations.

Torch-free: the plan and the dry run call it for every rank; tests/distributed compare the
static bytes with what the ranks really hold. Beyond the placement rules (params.py):
- FSDP (zero 2/3): gradients and AdamW moments follow the parameter shards;
- ZeRO-1 keeps whole parameters and gradients, and AdamW moments only for the parameters
  the rank owns (parallel.dims.zero1_owners);
- AdamW keeps two moments per element (fp32, or bf16 with optimizer_state_dtype=bf16) and a
  4-byte step count per parameter tensor. Parameters are fp32: they are the master weights.
- weight copies, held from forward to backward (not in `static_bytes`: they are gone after
  the step): FSDP's gathered compute-dtype weights (parallel/fsdp.py: zero=2 keeps every unit
  gathered, reshard_after_forward=False, and so does a zero-bubble pipeline schedule;
  zero=3 keeps the head unit - final norm and head, with the embedding when tied - gathered,
  plus the block in use (the one prefetched in backward is a collective buffer,
  peak.collective_buffer_bytes; at the loss no block is gathered yet but the prefetched last
  one); the untied embedding is its own unit, re-sharded after forward); without FSDP, autocast's low-precision copies of every matmul weight
  (nn.Linear weights and the tied head; saved for backward, 2 B/param in bf16/fp16).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from conf.parallel_rules import SPLIT_BACKWARD_SCHEDULES
from conf.schema import RecomputeMode, RecomputeTarget
from conf.spec import ModelSpec, RecomputeSpec, RunSpec
from parallel.cost.activations import (
    DTYPE_BYTES,
    ActivationSplit,
    activation_bytes,
    activation_dtypes,
    loss_peak_bytes,
    pipeline_in_flight,
    selective_targets,
    stage_output_bytes_per_token,
)
from parallel.cost.params import (
    embedding_param,
    fsdp_local_numel,
    held_layers,
    held_parameters,
    numel,
    parameter_shapes,
    tp_local_shape,
)
from parallel.cost.peak import step_peak_bytes
from parallel.dims import ParallelDims, zero1_owners
from training.models import family_of
from training.models.family import block_index

PARAM_BYTES = 4
STEP_BYTES = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticBytes:
    params: int
    grads: int
    optimizer: int


def static_bytes(spec: RunSpec, rank: int) -> StaticBytes:
    """Parameters, gradients and optimizer state `rank` holds after an optimizer step."""
    dims = ParallelDims.from_spec(spec.parallel)
    coords = dims.coordinates(rank)
    moment_bytes = 2 if spec.precision.optimizer_state_dtype.value == "bf16" else 4
    local = _tp_local_shapes(spec, coords["pp"], dims.tp)
    if dims.uses_fsdp:
        shards, index = dims.dp_shard * dims.cp, coords["dp_shard"] * dims.cp + coords["cp"]
        sizes = [fsdp_local_numel(s, shards=shards, index=index) for s in local]
    else:
        sizes = [numel(s) for s in local]
    # AdamW keeps state for what it updates: everything held, except under ZeRO-1
    optimized, tensors = sum(sizes), len(sizes)
    if dims.zero == 1 and dims.uses_ddp:
        optimized, tensors = zero1_shares(tuple(sizes), dims.dp_shard)[coords["dp_shard"]]
    params = PARAM_BYTES * sum(sizes)
    optimizer = 2 * moment_bytes * optimized + STEP_BYTES * tensors
    return StaticBytes(params=params, grads=params, optimizer=optimizer)


def _tp_local_shapes(spec: RunSpec, pp_rank: int, tp: int) -> list[tuple[int, ...]]:
    family = spec.model.family
    return [tp_local_shape(n, s, tp, family) for n, s in held_parameters(spec, pp_rank)]


@lru_cache(maxsize=64)
def zero1_shares(sizes: tuple[int, ...], n: int) -> tuple[tuple[int, int], ...]:
    """(elements, tensors) whose AdamW state each of the `n` ZeRO-1 owners keeps; owners
    computed once per layout (parallel.dims.zero1_owners), not once per rank."""
    shares = [[0, 0] for _ in range(n)]
    for size, owner in zip(sizes, zero1_owners(list(sizes), n)):
        shares[owner][0] += size
        shares[owner][1] += 1
    return tuple((elements, count) for elements, count in shares)


def weight_copy_bytes(spec: RunSpec, rank: int) -> int:
    """Bytes of compute-dtype weight copies `rank` holds from forward to backward (above)."""
    dims = ParallelDims.from_spec(spec.parallel)
    compute = DTYPE_BYTES[spec.precision.compute_dtype.value]
    held = held_parameters(spec, dims.coordinates(rank)["pp"])
    local = {name: numel(tp_local_shape(name, shape, dims.tp, spec.model.family))
             for name, shape in held}
    if dims.uses_fsdp:
        if dims.zero == 2 or dims.pp > 1 and spec.parallel.pp_schedule in SPLIT_BACKWARD_SCHEDULES:
            return compute * sum(local.values())
        blocks: dict[str, int] = {}
        for name, size in local.items():
            if block_index(name) is not None:
                blocks[block_index(name)] = blocks.get(block_index(name), 0) + size
        head_unit = sum(size for name, size in local.items()
                        if block_index(name) is None
                        and (name != embedding_param(spec.model) or spec.model.tie_embeddings))
        return compute * (head_unit + max(blocks.values(), default=0))
    if compute >= PARAM_BYTES:
        return 0  # fp32 compute: autocast casts nothing
    recompute = autocast_cache_policy(spec.recompute, pp=dims.pp)
    return compute * sum(size for (name, shape), size in zip(held, local.values())
                         if autocast_keeps_copy(name, shape, spec.model, recompute,
                                                device_type=spec.training.device,
                                                loss_chunks=spec.training.loss_chunks))


def autocast_cache_policy(recompute: RecomputeSpec, *, pp: int) -> RecomputeSpec:
    """The policy whose weight copies autocast keeps. A pipeline runs its whole schedule,
    backward included, in one autocast region (parallel/pipeline.py `_run`), so autocast's
    cast cache keeps every matmul weight's copy until the step ends, whatever is
    re-computed (measured on gloo ranks): as without recompute. Elsewhere autocast wraps
    the forward only, and its cache goes with it."""
    return recompute if pp == 1 else RecomputeSpec(mode=RecomputeMode.none)


def autocast_keeps_copy(name: str, shape: tuple[int, ...], model: ModelSpec,
                        recompute: RecomputeSpec, *, device_type: str,
                        loss_chunks: int = 1) -> bool:
    """Is autocast's compute-dtype copy of weight `name` saved from forward to backward?
    Matmul weights only (the head, and the embedding when tied), and in a block only where
    its matmul is not re-computed (a checkpointed region saves no cast) nor offloaded to host
    memory (a GPU's offload hooks move the copies too, as they are not parameters). A head
    run in row blocks (`loss_chunks` > 1) takes its gradients in forward and saves nothing."""
    if len(shape) != 2:
        return False
    if block_index(name) is None:
        return loss_chunks == 1 and (name != embedding_param(model) or model.tie_embeddings)
    policy = recompute if recompute.applies_to(block_index(name)) else None
    if policy is None or policy.mode is RecomputeMode.none:
        return True
    if policy.mode is RecomputeMode.offload:
        return device_type == "cpu"
    targets = selective_targets(policy)
    if policy.mode is RecomputeMode.full or {RecomputeTarget.block, RecomputeTarget.ops} & targets:
        return False
    return not (RecomputeTarget.ffn in targets
                and family_of(model).in_recomputed_submodule(RecomputeTarget.ffn, name))


def autocast_copied_weights(model: ModelSpec, recompute: RecomputeSpec, *,
                            device_type: str) -> list[int]:
    """Elements of each weight whose autocast copy a whole model keeps (one process)."""
    return [numel(shape) for name, shape in parameter_shapes(model)
            if autocast_keeps_copy(name, shape, model, recompute, device_type=device_type)]


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Bytes per rank. Parameters stay fp32 (they are the master weights under autocast)."""

    params: int
    grads: int
    optimizer: int
    master_weights: int
    weight_copies: int
    """Compute-dtype copies of the weights held from forward to backward (weight_copy_bytes)."""
    activations: int
    loss_peak: int = 0
    """Transient bytes at the loss beyond the kept activations (activations.loss_peak_bytes)."""
    in_step: int
    """Bytes alive at the step's fullest phase beyond parameters, optimizer state and weight
    copies: gradients, activations, transients, recompute working set, collective buffers
    (parallel.cost.peak.step_peak_bytes)."""

    @property
    def static(self) -> int:
        """What stays between steps: parameters, gradients, optimizer state."""
        return self.params + self.grads + self.optimizer + self.master_weights

    @property
    def total(self) -> int:
        """The peak: parameters, optimizer state and weight copies, plus the fullest phase
        of the step (the loss, a block's backward or the optimizer step)."""
        return self.params + self.optimizer + self.master_weights + self.weight_copies \
            + self.in_step


def estimate_memory(spec: RunSpec, *, rank: int | None = None) -> MemoryEstimate:
    """Bytes `rank` holds under the run's layout (default: the rank that holds the most).

    Parameters, gradients and optimizer state are exact (`static_bytes`; checked on every
    rank in tests/distributed). Activations: the per-block counts measured on one process,
    for this rank's tokens (micro-batch / pipeline micro-batches / cp), its blocks, and the
    pipeline chunks in flight, in the run's dtype regime and tp/sp/cp split."""
    if rank is None:
        return max((estimate_memory(spec, rank=r) for r in representative_ranks(spec)),
                   key=lambda m: m.total)
    static = static_bytes(spec, rank)
    activations, loss_peak = layout_activation_bytes(spec, rank), loss_peak_bytes_of(spec, rank)
    return MemoryEstimate(params=static.params, grads=static.grads, optimizer=static.optimizer,
                          master_weights=0, weight_copies=weight_copy_bytes(spec, rank),
                          activations=activations, loss_peak=loss_peak,
                          in_step=step_peak_bytes(spec, rank, grads=static.grads,
                                                  optimizer=static.optimizer,
                                                  activations=activations,
                                                  loss_peak=loss_peak))


def representative_ranks(spec: RunSpec) -> list[int]:
    """Ranks among which the fullest is: every pipeline rank; shard 0 of FSDP (its chunks
    are the ceil-sized ones); under ZeRO-1 one owner per distinct share (the first with it),
    as ranks with equal shares hold equal bytes."""
    dims = ParallelDims.from_spec(spec.parallel)
    ranks = set()
    for pp in range(dims.pp):
        shards = [0]
        if dims.zero == 1 and dims.uses_ddp:
            sizes = tuple(numel(s) for s in _tp_local_shapes(spec, pp, dims.tp))
            first: dict[tuple[int, int], int] = {}
            for shard, share in enumerate(zero1_shares(sizes, dims.dp_shard)):
                first.setdefault(share, shard)
            shards = list(first.values())
        ranks |= {dims.rank_of({"pp": pp, "dp_replicate": 0, "dp_shard": shard, "cp": 0,
                                "tp": 0}) for shard in shards}
    return sorted(ranks)


def layout_activation_bytes(spec: RunSpec, rank: int) -> int:
    """Activation bytes `rank` keeps at its fullest: the pipeline chunks in flight, each with
    one virtual stage's blocks (this rank's blocks / virtual stages), in the run's dtype
    regime and tp/sp/cp split (activations.py); the head on the last pipeline rank, for one
    micro-batch (for all of them under GPipe)."""
    p, t = spec.parallel, spec.training
    dims = ParallelDims.from_spec(p)
    pp_rank = dims.coordinates(rank)["pp"]
    micro_batch = t.micro_batch_size // p.pp_microbatches
    tokens = micro_batch * t.seq_len // p.cp
    kwargs = dict(tokens=tokens, micro_batch=micro_batch, recompute=spec.recompute,
                  device_type=t.device,
                  split=ActivationSplit.of(p, document_mask=spec.data.document_mask,
                                           loss_chunks=t.loss_chunks),
                  dtypes=activation_dtypes(spec.precision, uses_fsdp=dims.uses_fsdp))
    layers = held_layers(spec, pp_rank)
    blocks = activation_bytes(spec.model, layers=layers, with_head=False,
                              with_embedding=False, **kwargs)
    chunks = pipeline_in_flight(p, pp_rank)
    total = blocks * chunks // p.pp_virtual_stages if p.pp > 1 else blocks
    heads = 0
    if pp_rank == p.pp - 1:
        heads = p.pp_microbatches if p.pp > 1 and p.pp_schedule == "gpipe" else 1
        total += heads * activation_bytes(spec.model, layers=[], with_embedding=False, **kwargs)
    if pp_rank == 0:
        first = p.pp_microbatches if p.pp > 1 and p.pp_schedule == "gpipe" else chunks
        total += first * activation_bytes(spec.model, layers=[], with_head=False, **kwargs)
    if p.pp > 1:
        total += pipeline_output_bytes(spec.model, chunks=chunks, heads=heads, tokens=tokens,
                                       dtypes=kwargs["dtypes"], split=kwargs["split"])
    return total


def pipeline_output_bytes(model: ModelSpec, *, chunks: int, heads: int, tokens: int,
                          dtypes, split: ActivationSplit) -> int:
    """The stage outputs a pipeline rank's schedule keeps (activations.stage_output_bytes_
    per_token): of its `chunks` in flight, `heads` ran the last stage (logits), the others
    send their output on."""
    def per_chunk(last: bool) -> int:
        return int(tokens * stage_output_bytes_per_token(model, last=last, dtypes=dtypes,
                                                         split=split))
    return heads * per_chunk(True) + (chunks - heads) * per_chunk(False)


def loss_peak_bytes_of(spec: RunSpec, rank: int) -> int:
    """The transient at the loss (activations.loss_peak_bytes) on the last pipeline rank."""
    p, t = spec.parallel, spec.training
    dims = ParallelDims.from_spec(p)
    if dims.coordinates(rank)["pp"] != p.pp - 1:
        return 0
    tokens = t.micro_batch_size // p.pp_microbatches * t.seq_len // p.cp
    return loss_peak_bytes(spec.model, tokens=tokens,
                           split=ActivationSplit.of(p, loss_chunks=t.loss_chunks),
                           dtypes=activation_dtypes(spec.precision, uses_fsdp=dims.uses_fsdp))
