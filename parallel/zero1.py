"""ZeRO-1: gradients all-reduced as in DDP, optimizer state sharded over the dp_shard ranks.

Each parameter has one owner among the shard ranks (`parallel.dims.zero1_owners`, greedy by
size); a rank keeps AdamW state only for what it owns and steps only those, then every owner
broadcasts its updated parameters. The optimizer a rank builds is a plain AdamW over its owned
parameters, so checkpoints (DCP, keyed by parameter name) need nothing special. Under tp the
parameters are DTensors: owners are drawn by their tp-local sizes, as the plan draws them
(parallel.cost.memory_static.zero1_sizes; the same on every tp rank, so a rank's tp peers
own the other shards of the same parameters), and each owner broadcasts its local shard over
its dp_shard group.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from parallel.dims import zero1_owners
from parallel.dp_tp_grads import local_tensor


class Zero1Partition:
    """Which parameters this rank owns, and the broadcast that shares the updates."""

    def __init__(self, params: list[torch.Tensor], *, group, group_rank: int, group_size: int):
        self.params = [p for p in params if p.requires_grad]
        self.owners = zero1_owners([local_tensor(p).numel() for p in self.params], group_size)
        self.group, self.group_rank = group, group_rank

    def owned(self) -> set[torch.Tensor]:
        return {p for p, owner in zip(self.params, self.owners) if owner == self.group_rank}

    @torch.no_grad()
    def broadcast_updates(self) -> None:
        for param, owner in zip(self.params, self.owners):
            dist.broadcast(local_tensor(param.data), group=self.group, group_src=owner)
