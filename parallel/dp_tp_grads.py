"""DDP and ZeRO-1 under tensor parallel: the gradients of DTensor parameters averaged over the
data-parallel ranks (dp x cp), bucketed, on their local shards.

torch's DistributedDataParallel cannot take DTensor parameters, so with parallel.tp > 1 and
parallel.zero 0 or 1 (Megatron's layout: tp inside a node, replicas across) the model is not
wrapped; instead, once the step's last micro-batch has run backward (the loop's
`gradient_sync(..., sync=True)` block, parallel/data_parallel.py), every parameter's local
gradient (a DTensor's `to_local()`: this tp rank's shard, or its whole copy of a replicated
one) is summed over the dp x cp group in buckets of about BUCKET_BYTES of one dtype (one
flat all-reduce each) and divided by the group's size: DDP's average. The tp peers of a rank
hold other shards and reduce over their own dp x cp group, so each shard is averaged with the
same shard of the other replicas and nothing else. A gradient that is still Partial over tp
is averaged the same way (the average is linear). Unlike DDP the reduction does not overlap
the backward (it runs after it, so the pipeline schedule's micro-batches need no count); the
plan counts it exposed (parallel/cost/comm.py, axis "dp_tp").

ZeRO-1 on top (parallel/zero1.py) steps only the parameters a rank owns and broadcasts their
local shards from the owner over the dp_shard ranks.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.tensor import DTensor

BUCKET_BYTES = 25 * 2**20
"""DDP's default bucket_cap_mb."""


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t`: a DTensor's local shard (sharing its storage), else `t`."""
    return t.to_local() if isinstance(t, DTensor) else t


class ShardGradAverage:
    """Averages the local gradients of `params` over `group` (`group_size` ranks)."""

    def __init__(self, params: list[torch.Tensor], *, group, group_size: int,
                 bucket_bytes: int = BUCKET_BYTES):
        self.params = [p for p in params if p.requires_grad]
        self.group, self.group_size, self.bucket_bytes = group, group_size, bucket_bytes

    @torch.no_grad()
    def all_reduce(self) -> None:
        grads = [local_tensor(p.grad) for p in self.params if p.grad is not None]
        for bucket in self._buckets(grads):
            flat = _flatten_dense_tensors(bucket)
            dist.all_reduce(flat, group=self.group)
            flat.div_(self.group_size)
            for grad, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
                grad.copy_(reduced)

    def _buckets(self, grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """In order, by (dtype, device); a bucket closes once it holds bucket_bytes."""
        open_: dict[tuple, list[torch.Tensor]] = {}
        sizes: dict[tuple, int] = {}
        out = []
        for grad in grads:
            key = (grad.dtype, grad.device)
            open_.setdefault(key, []).append(grad)
            sizes[key] = sizes.get(key, 0) + grad.numel() * grad.element_size()
            if sizes[key] >= self.bucket_bytes:
                out.append(open_.pop(key))
                sizes[key] = 0
        return out + list(open_.values())
