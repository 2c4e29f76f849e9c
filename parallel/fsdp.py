"""ZeRO-2/3 and HSDP with FSDP2 (`fully_shard`) over the dp_shard x cp ranks.

zero=3 re-shards parameters after forward (all-gathered again for backward); zero=2 keeps
them gathered from forward to backward (no second all-gather, more memory); both shard
gradients (reduce-scatter) and optimizer state. With dp_replicate > 1 the mesh is 2-D
(replicate, shard): HSDP, shards within a group and all-reduce across the groups.
Each block is its own FSDP unit; the root unit holds the embedding, final norm and head.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from conf.spec import PrecisionSpec

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def mixed_precision_policy(precision: PrecisionSpec) -> MixedPrecisionPolicy:
    """Compute in the compute dtype from fp32 master shards; reduce in reduce_dtype."""
    compute = precision.compute_dtype.value
    param_dtype = None if compute == "fp32" else TORCH_DTYPES[compute]
    return MixedPrecisionPolicy(param_dtype=param_dtype,
                                reduce_dtype=TORCH_DTYPES[precision.reduce_dtype.value])


def apply_fsdp(model: nn.Module, *, mesh: DeviceMesh, zero: int,
               precision: PrecisionSpec) -> None:
    """Shard `model` (a model or one pipeline stage) in place."""
    policy = mixed_precision_policy(precision)
    reshard = zero == 3
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)


def set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """Reduce-scatter gradients only on the last micro-batch of a step."""
    model.set_requires_gradient_sync(sync)
