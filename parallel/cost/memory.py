"""Bytes per rank under a parallel layout: parameters, gradients, optimizer state, activations.

Torch-free: the plan and the dry run call it for every rank; tests/distributed compare the
static bytes with what the ranks really hold. Beyond the placement rules (params.py):
- FSDP (zero 2/3): gradients and AdamW moments follow the parameter shards;
- ZeRO-1 keeps whole parameters and gradients, and AdamW moments only for the parameters
  the rank owns (parallel.dims.zero1_owners);
- AdamW keeps two moments per element (fp32, or bf16 with optimizer_state_dtype=bf16) and a
  4-byte step count per parameter tensor. Parameters are fp32: they are the master weights.
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.spec import RunSpec
from parallel.cost.activations import DTYPE_BYTES, activation_bytes, pipeline_in_flight
from parallel.cost.params import (
    fsdp_local_numel,
    held_layers,
    held_parameters,
    numel,
    tp_local_shape,
)
from parallel.dims import ParallelDims, zero1_owners

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
    local = [tp_local_shape(n, s, dims.tp) for n, s in held_parameters(spec, coords["pp"])]
    if dims.uses_fsdp:
        shards, index = dims.dp_shard * dims.cp, coords["dp_shard"] * dims.cp + coords["cp"]
        sizes = [fsdp_local_numel(s, shards=shards, index=index) for s in local]
    else:
        sizes = [numel(s) for s in local]
    optimized = sizes  # AdamW keeps state for what it updates: everything held, except ZeRO-1
    if dims.zero == 1 and dims.uses_ddp:
        owners = zero1_owners(sizes, dims.dp_shard)
        optimized = [n for n, o in zip(sizes, owners) if o == coords["dp_shard"]]
    params = PARAM_BYTES * sum(sizes)
    optimizer = 2 * moment_bytes * sum(optimized) + STEP_BYTES * len(optimized)
    return StaticBytes(params=params, grads=params, optimizer=optimizer)


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryEstimate:
    """Bytes per rank. Parameters stay fp32 (they are the master weights under autocast)."""

    params: int
    grads: int
    optimizer: int
    master_weights: int
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.master_weights + self.activations


def estimate_memory(spec: RunSpec, *, rank: int | None = None) -> MemoryEstimate:
    """Bytes `rank` holds under the run's layout (default: the rank that holds the most).

    Parameters, gradients and optimizer state are exact (`static_bytes`; checked on every
    rank in tests/distributed). Activations: the per-block counts measured on one process,
    for this rank's tokens (micro-batch / pipeline micro-batches / cp), its blocks, and the
    pipeline micro-batches in flight; split evenly over tp (an approximation)."""
    if rank is None:
        return max((estimate_memory(spec, rank=r) for r in representative_ranks(spec)),
                   key=lambda m: m.total)
    static = static_bytes(spec, rank)
    return MemoryEstimate(params=static.params, grads=static.grads, optimizer=static.optimizer,
                          master_weights=0, activations=layout_activation_bytes(spec, rank))


def representative_ranks(spec: RunSpec) -> list[int]:
    """Ranks among which the fullest is: every pipeline rank; shard 0 of FSDP (its chunks
    are the ceil-sized ones); every ZeRO-1 owner (their shares differ)."""
    dims = ParallelDims.from_spec(spec.parallel)
    shards = range(dims.dp_shard) if dims.zero == 1 else range(1)
    return sorted({dims.rank_of({"pp": pp, "dp_replicate": 0, "dp_shard": shard, "cp": 0,
                                 "tp": 0})
                   for pp in range(dims.pp) for shard in shards})


def layout_activation_bytes(spec: RunSpec, rank: int) -> int:
    """Activation bytes `rank` keeps at its fullest: its blocks' micro-batches in flight."""
    p, t = spec.parallel, spec.training
    dims = ParallelDims.from_spec(p)
    pp_rank = dims.coordinates(rank)["pp"]
    tokens = t.micro_batch_size // p.pp_microbatches * t.seq_len // p.cp
    per_micro_batch = activation_bytes(
        spec.model, tokens=tokens, recompute=spec.recompute, device_type=t.device,
        dtype_bytes=DTYPE_BYTES[spec.precision.compute_dtype.value],
        layers=held_layers(spec, pp_rank), with_head=pp_rank == p.pp - 1)
    return per_micro_batch * pipeline_in_flight(p, pp_rank) // p.tp
