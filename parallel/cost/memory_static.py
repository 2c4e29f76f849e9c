"""What a rank holds between steps (fp32 parameters, gradients, AdamW state) and the
compute-dtype weight copies it holds from forward to backward. Torch-free.

Beyond the placement rules (params.py):
- FSDP (zero 2/3): gradients and AdamW moments follow the parameter shards;
- ZeRO-1 keeps whole parameters and gradients, and AdamW moments only for the parameters
  the rank owns (parallel.dims.zero1_owners);
- AdamW keeps two moments per element (fp32, or bf16 with optimizer_state_dtype=bf16) and a
  4-byte step count per parameter tensor. Parameters are fp32: they are the master weights.
- weight copies, held from forward to backward (not in the static bytes: they are gone after
  the step): FSDP's gathered compute-dtype weights (parallel/fsdp.py: zero=2 keeps every unit
  gathered, reshard_after_forward=False, and so does a zero-bubble pipeline schedule;
  zero=3 keeps the head unit - final norm and head, with the embedding when tied - gathered,
  plus the block in use (the one prefetched in backward is a collective buffer,
  peak.collective_buffer_bytes; at the loss no block is gathered yet but the prefetched last
  one); the untied embedding is its own unit, re-sharded after forward); without FSDP,
  autocast's low-precision copies of every matmul weight (nn.Linear weights and the tied
  head - on the rank running the head: a first pipeline stage's tied embedding is only
  looked up; saved for backward, 2 B/param in bf16/fp16).
Every block holds alike tensors, so a pipeline rank's sums are its other tensors' plus one
block's x its blocks (ZeRO-1's owners, which depend on every tensor's size in order, aside).
Each term is memoised on its keyword arguments (memory_views.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from conf.rules.parallel_rules import SPLIT_BACKWARD_SCHEDULES
from conf.schema import RecomputeMode, RecomputeTarget
from conf.spec import ModelSpec, RecomputeSpec
from parallel.cost.activations import selective_targets
from parallel.cost.memory_views import CACHE, Holds, Place, Sharding, Stages
from parallel.cost.params import (
    _stage_parameters,
    embedding_param,
    numel,
    parameter_shapes,
    sharded_numel,
    tp_local_shape,
)
from parallel.cost.optimizer_state import STEP_BYTES, muon_matrix, optimizer_state_bytes  # noqa: F401
from parallel.dims import zero1_owners
from training.models import family_of
from training.models.family import block_index, block_param, block_path

PARAM_BYTES = 4

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StaticBytes:
    params: int
    grads: int
    optimizer: int


@dataclass(frozen=True, slots=True)
class Holding:
    """What one pipeline rank holds: every tensor in order, its blocks, and per kind of
    tensor (outside the blocks; one block's, named as block 0's) (name, shape, tp-local)."""

    tensors: tuple[tuple[str, Shape], ...]
    layers: tuple[int, ...]
    root: tuple[tuple[str, Shape, Shape], ...]
    block: tuple[tuple[str, Shape, Shape], ...]
    """The largest block's tensors (all blocks alike in a dense model), named as block 0's."""
    blocks: tuple[tuple[str, Shape, Shape], ...] | None = None
    """Every held block's tensors when blocks differ (MoE blocks after dense ones), else None."""


@lru_cache(maxsize=CACHE)
def holding(*, model: ModelSpec, holds: Holds, tp: int, pp_rank: int) -> Holding:
    """The full-size parameters pipeline rank `pp_rank` holds (params.held_parameters)."""
    if holds.pp == 1:
        tensors = tuple(parameter_shapes(model))
    else:
        tensors = _stage_parameters(model, holds.pp, holds.pp_virtual_stages, holds.split,
                                    pp_rank)
    family = model.family
    layers = tuple(sorted({block_index(n) for n, _ in tensors if block_index(n) is not None}))
    root = tuple((n, s, tp_local_shape(n, s, tp, family)) for n, s in tensors
                 if block_index(n) is None)
    kinds = _block_kinds(model)
    largest = max(kinds, key=lambda entries: sum(numel(s) for _, s in entries), default=())
    block = tuple((n, s, tp_local_shape(n, s, tp, family)) for n, s in largest) if layers else ()
    blocks = None
    if len(kinds) > 1:
        blocks = tuple((n, s, tp_local_shape(n, s, tp, family)) for n, s in tensors
                       if block_index(n) is not None)
    return Holding(tensors=tensors, layers=layers, root=root, block=block, blocks=blocks)


@lru_cache(maxsize=CACHE)
def _block_kinds(model: ModelSpec) -> tuple[tuple[tuple[str, Shape], ...], ...]:
    """The distinct blocks of the model (one in a dense model), each named as block 0's."""
    by_layer: dict[int, list[tuple[str, Shape]]] = {}
    for name, shape in parameter_shapes(model):
        index = block_index(name)
        if index is not None:
            by_layer.setdefault(index, []).append((block_param(0, block_path(name)), shape))
    return tuple(dict.fromkeys(tuple(entries) for entries in by_layer.values()))


@lru_cache(maxsize=CACHE)
def static_of(*, model: ModelSpec, holds: Holds, sharding: Sharding, moment_bytes: int,
              place: Place, muon: bool = False) -> StaticBytes:
    """Parameters, gradients and optimizer state the rank at `place` holds after an optimizer
    step. `moment_bytes`: 2 with bf16 AdamW moments, else 4; `muon`: optim=muon (its
    matrices keep one fp32 buffer instead: optimizer_state.py)."""
    held = holding(model=model, holds=holds, tp=sharding.tp, pp_rank=place.pp_rank)
    if sharding.zero1:
        sizes = zero1_sizes(model=model, holds=holds, tp=sharding.tp, pp_rank=place.pp_rank)
        elements = sum(sizes)
        optimized, tensors = zero1_shares(sizes, sharding.owners)[place.owner]
        flags = tuple(muon and muon_matrix(n, s) for n, s in held.tensors)
        muon_elements, muon_tensors = zero1_shares(sizes, sharding.owners,
                                                   counted=flags)[place.owner]
    else:
        def size(name: str, shape: Shape) -> int:
            return sharded_numel(name, shape, family=model.family, shards=sharding.shards,
                                 index=place.shard, ep=sharding.ep,
                                 expert_shards=sharding.expert_shards)
        blocks = len(held.layers)
        elements = (sum(size(n, local) for n, _, local in held.root)
                    + blocks * sum(size(n, local) for n, _, local in held.block))
        optimized, tensors = elements, len(held.root) + blocks * len(held.block)
        each = held.block
        if held.blocks is not None:  # blocks differ: each one's own tensors
            blocks, each = 1, held.blocks
            elements = (sum(size(n, local) for n, _, local in held.root)
                        + sum(size(n, local) for n, _, local in each))
            optimized, tensors = elements, len(held.root) + len(each)
        matrices = [(name, local) for name, shape, local in each
                    if muon and muon_matrix(name, shape)]
        muon_elements = blocks * sum(size(name, local) for name, local in matrices)
        muon_tensors = blocks * len(matrices)
    params = PARAM_BYTES * elements
    return StaticBytes(params=params, grads=params, optimizer=optimizer_state_bytes(
        adamw_elements=optimized - muon_elements, adamw_tensors=tensors - muon_tensors,
        muon_elements=muon_elements, moment_bytes=moment_bytes))


@lru_cache(maxsize=CACHE)
def zero1_sizes(*, model: ModelSpec, holds: Holds, tp: int, pp_rank: int
                ) -> tuple[int, ...]:
    """Elements of each tensor a pipeline rank holds, tp-local, in order (ZeRO-1's owners
    depend on the order)."""
    held = holding(model=model, holds=holds, tp=tp, pp_rank=pp_rank)
    return tuple(numel(tp_local_shape(n, s, tp, model.family)) for n, s in held.tensors)


@lru_cache(maxsize=CACHE)
def zero1_shares(sizes: tuple[int, ...], n: int, counted: tuple[bool, ...] | None = None
                 ) -> tuple[tuple[int, int], ...]:
    """(elements, tensors) whose optimizer state each of the `n` ZeRO-1 owners keeps; owners
    computed once per layout (parallel.dims.zero1_owners), not once per rank. With `counted`
    (a flag per tensor: Muon's matrices) only the flagged tensors are summed; owners are
    assigned over every tensor all the same."""
    shares = [[0, 0] for _ in range(n)]
    flags = counted if counted is not None else (True,) * len(sizes)
    for size, flag, owner in zip(sizes, flags, _owners(sizes, n)):
        if flag:
            shares[owner][0] += size
            shares[owner][1] += 1
    return tuple((elements, count) for elements, count in shares)


@lru_cache(maxsize=CACHE)
def _owners(sizes: tuple[int, ...], n: int) -> tuple[int, ...]:
    return tuple(zero1_owners(list(sizes), n))


@lru_cache(maxsize=CACHE)
def representative_places(*, model: ModelSpec, holds: Holds, sharding: Sharding
                          ) -> tuple[Place, ...]:
    """Places among which the fullest rank is, in rank order: every pipeline rank; shard 0
    of FSDP (its chunks are the ceil-sized ones); under ZeRO-1 one owner per distinct share
    (the first with it), as ranks with equal shares hold equal bytes."""
    places = []
    for pp_rank in range(holds.pp):
        owners = [0]
        if sharding.zero1:
            sizes = zero1_sizes(model=model, holds=holds, tp=sharding.tp, pp_rank=pp_rank)
            first: dict[tuple[int, int], int] = {}
            for owner, share in enumerate(zero1_shares(sizes, sharding.owners)):
                first.setdefault(share, owner)
            owners = list(first.values())
        places += [Place(pp_rank, 0, owner) for owner in owners]
    return tuple(places)


@lru_cache(maxsize=CACHE)
def static_rows(*, model: ModelSpec, holds: Holds, sharding: Sharding, moment_bytes: int,
                muon: bool = False) -> tuple[tuple[Place, StaticBytes], ...]:
    """static_of each representative place, in rank order."""
    return tuple((place, static_of(model=model, holds=holds, sharding=sharding,
                                   moment_bytes=moment_bytes, place=place, muon=muon))
                 for place in representative_places(model=model, holds=holds,
                                                    sharding=sharding))


def ep_block_elements(model: ModelSpec, *, tp: int, ep: int, shards: int = 1, index: int = 0,
                      expert_shards: int = 1) -> int:
    """Under expert parallelism (ep > 1), the elements of the largest block on a rank (FSDP
    shard `index` of `shards`; the routed experts: the rank's E/ep of them, FSDP-sharded over
    `expert_shards`, params.sharded_numel): what one block's units gather and reduce."""
    family = model.family
    return max((sum(sharded_numel(n, tp_local_shape(n, s, tp, family), family=family,
                                  shards=shards, index=index, ep=ep,
                                  expert_shards=expert_shards) for n, s in kind)
                for kind in _block_kinds(model)), default=0)


@lru_cache(maxsize=CACHE)
def ep_layer_elements(model: ModelSpec, *, layer: int, tp: int, ep: int) -> int:
    """Elements of block `layer`'s parameters gathered on a rank under ep: tp-local, the
    routed experts the rank's E/ep."""
    family = model.family
    return sum(sharded_numel(n, tp_local_shape(n, s, tp, family), family=family, shards=1,
                             index=0, ep=ep) for n, s in parameter_shapes(model)
               if block_index(n) == layer)


def weight_copies(*, model: ModelSpec, stages: Stages, sharding: Sharding, compute_bytes: int,
                  recompute: RecomputeSpec, device_type: str, loss_chunks: int
                  ) -> tuple[int, ...]:
    """Bytes of compute-dtype weight copies each pipeline rank holds from forward to
    backward (module docstring)."""
    if sharding.fsdp:
        return fsdp_copy_bytes(model=model, holds=stages.holds, schedule=stages.pp_schedule,
                               tp=sharding.tp, zero=sharding.zero, compute_bytes=compute_bytes,
                               ep=sharding.ep)
    if compute_bytes >= PARAM_BYTES:
        return (0,) * stages.pp  # fp32 compute: autocast casts nothing
    return autocast_copy_bytes(model=model, holds=stages.holds, tp=sharding.tp,
                               compute_bytes=compute_bytes, recompute=recompute,
                               device_type=device_type, loss_chunks=loss_chunks)


@lru_cache(maxsize=CACHE)
def fsdp_copy_bytes(*, model: ModelSpec, holds: Holds, schedule: str, tp: int, zero: int,
                    compute_bytes: int, ep: int = 1) -> tuple[int, ...]:
    """The units FSDP keeps gathered on each pipeline rank (module docstring); under ep a
    block's experts are the rank's E/ep (`ep_block_elements`)."""
    every_unit = zero == 2 or holds.pp > 1 and schedule in SPLIT_BACKWARD_SCHEDULES
    block = ep_block_elements(model, tp=tp, ep=ep) if ep > 1 else None
    return tuple(compute_bytes * _fsdp_gathered(model, holding(
        model=model, holds=holds, tp=tp, pp_rank=pp_rank), every_unit, block)
        for pp_rank in range(holds.pp))


def stage_elements(model: ModelSpec, held: Holding) -> int:
    """Elements of every parameter a (pipeline) rank holds: tp-local, whole over FSDP shards."""
    return _fsdp_gathered(model, held, every_unit=True)


def _fsdp_gathered(model: ModelSpec, held: Holding, every_unit: bool,
                   block: int | None = None) -> int:
    if block is None or not held.block:
        block = sum(numel(local) for _, _, local in held.block)
    if every_unit:
        return sum(numel(local) for _, _, local in held.root) + len(held.layers) * block
    head_unit = sum(numel(local) for name, _, local in held.root
                    if name != embedding_param(model) or model.tie_embeddings)
    return head_unit + min(1, len(held.layers)) * block


@lru_cache(maxsize=CACHE)
def autocast_copy_bytes(*, model: ModelSpec, holds: Holds, tp: int, compute_bytes: int,
                        recompute: RecomputeSpec, device_type: str, loss_chunks: int
                        ) -> tuple[int, ...]:
    """Autocast's copies of the weights each pipeline rank keeps (its blocks the policy
    covers alike, the others alike)."""
    recompute = autocast_cache_policy(recompute, pp=holds.pp)
    return tuple(compute_bytes * _autocast_copied(model, holding(
        model=model, holds=holds, tp=tp, pp_rank=pp_rank), recompute, device_type,
        loss_chunks) for pp_rank in range(holds.pp))


def _autocast_copied(model: ModelSpec, held: Holding, recompute: RecomputeSpec,
                     device_type: str, loss_chunks: int) -> int:
    def keeps(name: str, shape: Shape) -> bool:
        return autocast_keeps_copy(name, shape, model, recompute, device_type=device_type,
                                   loss_chunks=loss_chunks)
    head_here = any(name.split(".")[0] in family_of(model).last_stage for name, _, _ in held.root)
    total = sum(numel(local) for name, shape, local in held.root if keeps(name, shape)
                and (head_here or name != embedding_param(model)))
    for covered in (True, False):
        same = [layer for layer in held.layers if recompute.applies_to(layer) is covered]
        if same:
            total += len(same) * sum(numel(local) for name, shape, local in held.block
                                     if keeps(block_param(same[0], block_path(name)), shape))
    return total


def autocast_cache_policy(recompute: RecomputeSpec, *, pp: int) -> RecomputeSpec:
    """The policy whose weight copies autocast keeps. A pipeline runs its whole schedule,
    backward included, in one autocast region (parallel/pipeline.py `_run`), so autocast's
    cast cache keeps every matmul weight's copy until the step ends, whatever is
    re-computed (measured on gloo ranks): as without recompute. Elsewhere autocast wraps
    the forward only, and its cache goes with it."""
    return recompute if pp == 1 else RecomputeSpec(mode=RecomputeMode.none)


def autocast_keeps_copy(name: str, shape: Shape, model: ModelSpec,
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
