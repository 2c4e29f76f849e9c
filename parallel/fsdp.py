"""ZeRO-2/3 and HSDP with FSDP2 (`fully_shard`) over the dp_shard x cp ranks.

zero=3 re-shards parameters after forward (all-gathered again for backward); zero=2 keeps
them gathered from forward to backward (no second all-gather, more memory); both shard
gradients (reduce-scatter) and optimizer state. With dp_replicate > 1 the mesh is 2-D
(replicate, shard): HSDP, shards within a group and all-reduce across the groups.
Each block is its own FSDP unit; the root unit holds the embedding, final norm and head.
"""
from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard


def apply_fsdp(model: nn.Module, *, mesh: DeviceMesh, zero: int,
               mp_policy: MixedPrecisionPolicy) -> None:
    """Shard `model` (a model or one pipeline stage) in place; compute and reduce in the
    dtypes of `mp_policy` (training/precision.py builds it from the precision section)."""
    reshard = zero == 3
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
