"""Expert parallelism: each MoE block's routed experts sharded over the ep ranks, tokens sent to
their experts' rank and back with all-to-all (uneven splits).

The model family names its experts module inside a block (`ModelFamily.experts`, e.g.
`moe.experts`): a GroupedExperts with 3-D weights w1, w2, w3 whose dim 0 is the expert, called
as `experts(x_sorted [M, dim], counts [E])`: the token copies sorted by expert id, `counts`
how many go to each expert. `apply_ep` makes each weight a DTensor on the ep mesh, Shard(0)
(rank r holds experts r*E/ep .. (r+1)*E/ep - 1, so a checkpoint keyed by name reshards across
ep degrees), and wraps the call:

  counts --all-to-all--> received counts [ep, E/ep] (the one host sync: the split sizes)
  tokens --all-to-all--> tokens from every ep rank, re-sorted by local expert
  local experts (the family's own forward, on the local weights)
  outputs --inverse sort, all-to-all back--> in the caller's order

Autograd runs through both all-to-alls (backward is the reverse exchange). Where the ep ranks
come from (torchtitan's choice): ep divides dp_shard x cp, the ranks whose tokens differ and
whose weights are alike; the experts' own FSDP shards over the dp_cp / ep ranks that hold the
same experts (parallel/mesh.py `ep` and `efsdp` axes; parallel/fsdp.py).
"""
from __future__ import annotations

import types

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from training.models.family import BLOCKS

EXPERT_WEIGHTS = ("w1", "w2", "w3")
"""The GroupedExperts weights; dim 0 is the expert."""


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with split sizes along dim 0; backward exchanges the gradient back
    (the splits swapped)."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group):
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, *, out_splits: list[int], in_splits: list[int],
               group) -> torch.Tensor:
    """Rows in_splits[r] of `x` go to rank r; out_splits[r] rows come from rank r."""
    return _AllToAll.apply(x, out_splits, in_splits, group)


def exchange_counts(counts: torch.Tensor, *, ep: int, group) -> tuple[torch.Tensor, list, list]:
    """(received [ep, E/ep]: tokens each ep rank sends to each local expert, the rows this
    rank sends to each rank, the rows it receives from each): one all-to-all of E integers
    and one host read of the split sizes."""
    local = counts.numel() // ep
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=group)
    received = received.view(ep, local)
    sizes = torch.cat([counts.view(ep, local).sum(1), received.sum(1)]).tolist()
    return received, sizes[:ep], sizes[ep:]


def local_order(received: torch.Tensor, *, rows: int) -> torch.Tensor:
    """Permutation that sorts the `rows` rows arriving as (source rank, local expert) blocks
    by local expert (stable: source rank order kept within an expert). `rows` (known from the
    split sizes) spares repeat_interleave a host read of its output size."""
    ep, local = received.shape
    expert_of_block = torch.arange(local, device=received.device).repeat(ep)
    expert_of_row = torch.repeat_interleave(expert_of_block, received.reshape(-1),
                                            output_size=rows)
    return torch.argsort(expert_of_row, stable=True)


class _LocalWeights:
    """The experts module as its own forward sees it, with each ep-sharded weight replaced by
    this rank's local shard (autograd flows back into the DTensor parameter)."""

    def __init__(self, module: nn.Module):
        object.__setattr__(self, "_module", module)

    def __getattr__(self, name: str):
        value = getattr(self._module, name)
        if name in EXPERT_WEIGHTS and isinstance(value, DTensor):
            return value.to_local()
        if isinstance(value, types.MethodType) and value.__self__ is self._module:
            return types.MethodType(value.__func__, self)  # its helpers see local weights too
        return value


def ep_forward(experts: nn.Module, x: torch.Tensor, counts: torch.Tensor, *, ep: int,
               group, local_forward) -> torch.Tensor:
    """Dispatch `x` (rows sorted by global expert id, `counts` [E]; rows past sum(counts),
    copies dropped by a capacity, stay here and come back as zeros) to the experts' ranks,
    run the local experts, and bring the outputs back in `x`'s order."""
    received, send, recv = exchange_counts(counts, ep=ep, group=group)
    routed = sum(send)
    arrived = all_to_all(x[:routed], out_splits=recv, in_splits=send, group=group)
    order = local_order(received, rows=arrived.shape[0])
    out = local_forward(_LocalWeights(experts), arrived[order], received.sum(0))
    unsorted = torch.empty_like(out).index_copy(0, order, out)  # autograd-safe inverse
    back = all_to_all(unsorted, out_splits=send, in_splits=recv, group=group)
    if routed == x.shape[0]:
        return back
    return torch.cat([back, back.new_zeros(x.shape[0] - routed, *back.shape[1:])])


def experts_modules(part: nn.Module, *, path: str) -> list[nn.Module]:
    """The experts module `path` (a block submodule) of every block of `part` that has one."""
    found = []
    for block in getattr(part, BLOCKS).values():
        try:
            found.append(block.get_submodule(path))
        except AttributeError:  # a dense block (dense layers before the first MoE layer)
            continue
    return found


def shard_experts(experts: nn.Module, *, ep_mesh: DeviceMesh) -> None:
    """Make w1, w2, w3 DTensors on `ep_mesh`, Shard(0) over the experts (on meta: no data)."""
    for name in EXPERT_WEIGHTS:
        param = getattr(experts, name)
        sharded = distribute_tensor(param.data, ep_mesh, [Shard(0)], src_data_rank=None)
        setattr(experts, name, nn.Parameter(sharded, requires_grad=param.requires_grad))


def apply_ep(part: nn.Module, *, ep_mesh: DeviceMesh, path: str) -> int:
    """Shard every experts module of `part` over `ep_mesh` and route its calls through the
    all-to-all; return how many modules it sharded."""
    ep, group = ep_mesh.size(), ep_mesh.get_group()
    modules = experts_modules(part, path=path)
    if not modules and getattr(part, BLOCKS):
        raise ValueError(f"parallel.ep={ep}, but no block of this model part has a "
                         f"{path!r} module to shard")
    for experts in modules:
        shard_experts(experts, ep_mesh=ep_mesh)
        local_forward = type(experts).forward

        def forward(self, x, counts, *, _local=local_forward):
            return ep_forward(self, x, counts, ep=ep, group=group, local_forward=_local)

        experts.forward = types.MethodType(forward, experts)
    return len(modules)
