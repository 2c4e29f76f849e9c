"""The mixture-of-experts router losses (balancing loss, z-loss) on the training loss path,
and the sigmoid router's balancing-bias update after the optimizer step.

The model keeps its last forward's weighted router losses (`router_losses()`, training/
models/moe/model/__init__.py); each micro-batch adds them x its target tokens to its token-loss
sum, so after the step's division by the global token count every token carries them once
(micro-batches and data-parallel ranks weigh them by their tokens; a pipeline stage's reach
the gradient through its output, weighed the same way: parallel/pipeline.py). The reported
loss stays the language-model loss; the router losses are metrics of their own
(training/routing_metrics.py).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from parallel.data_parallel import unwrap
from training.loss import IGNORE_INDEX


def with_router_losses(model: nn.Module, loss_sum: torch.Tensor,
                       targets: torch.Tensor) -> torch.Tensor:
    """`loss_sum` plus the model's router losses of this forward x the target tokens."""
    losses = getattr(unwrap(model), "router_losses", None)
    value = losses() if losses is not None else None
    if value is None:
        return loss_sum
    return loss_sum + value * (targets != IGNORE_INDEX).sum()


def moe_layers(parts: list[nn.Module]) -> dict[int, nn.Module]:
    """Every MoE feed-forward the model parts hold, by block index."""
    found = {}
    for part in parts:
        layers = getattr(unwrap(part), "moe_layers", None)
        if layers is not None:
            found.update(layers())
    return found


@torch.no_grad()
def update_expert_biases(parts: list[nn.Module], *, group=None) -> None:
    """DeepSeek-V3's auxiliary-loss-free balancing: each sigmoid router's bias moves by
    bias_update_rate x sign(mean load - expert's load) over the step's tokens (summed over
    `group`, the ranks that saw different tokens, so every rank keeps the same bias)."""
    layers = [m for m in moe_layers(parts).values() if m.expert_bias is not None]
    if not layers:
        for m in moe_layers(parts).values():
            m.load_since_step.zero_()
        return
    loads = torch.stack([m.load_since_step for m in layers])
    if group is not None:
        dist.all_reduce(loads, group=group)
    for m, load in zip(layers, loads):
        m.expert_bias += m.moe.bias_update_rate * torch.sign(load.mean() - load)
        m.load_since_step.zero_()
