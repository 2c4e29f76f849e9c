"""Weights every tensor-parallel rank holds whole but computes on its own tokens: their
gradients summed over the tp ranks after backward.

Under sequence parallel the model family's token-local modules (`TpPlan.token_local`: the MoE
feed-forward's router, routed and shared experts, with expert-tensor-parallel degree 1 as in
torchtitan) take each tp rank's share of the sequence as a plain tensor. Their weights are
not DTensors on the tp mesh, so nothing reduces their gradients over tp: each rank holds the
gradient of its tokens only. `sum_over_tp` adds them up once a step, after the last
micro-batch's backward (and FSDP's reduce-scatter over dp, which it commutes with: both are
sums), before the norm and the optimizer step; every tp rank then holds the same gradient,
which the gradient norm counts once (a plain or dp-sharded tensor is not summed over tp by
parallel/grad_norm.py). Without sequence parallel every tp rank computes these modules on
the whole sequence, so their gradients are already equal and no sum is needed.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def replicated_params(modules: list[nn.Module]) -> list[torch.Tensor]:
    """The parameters of `modules`, each once."""
    seen: dict[int, torch.Tensor] = {}
    for module in modules:
        for param in module.parameters():
            seen.setdefault(id(param), param)
    return list(seen.values())


@torch.no_grad()
def sum_over_tp(modules: list[nn.Module], *, group) -> None:
    """Collective over `group` (the tp ranks): each gradient of `modules`' parameters becomes
    the sum of the ranks' gradients, one all-reduce per dtype. Every rank holds the same
    parameters with the same shards (dp and ep split them alike on each tp rank)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for param in replicated_params(modules):
        if param.grad is None:  # never skip the collective: another rank may have one
            param.grad = torch.zeros_like(param)
        grad = param.grad
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        by_dtype.setdefault(local.dtype, []).append(local)
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=group)
        for grad, part in zip(grads, flat.split([g.numel() for g in grads])):
            grad.copy_(part.view_as(grad))
