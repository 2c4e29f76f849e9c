"""One optimizer step's forward/backward over its micro-batches, weighted by tokens."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parallel.data_parallel import no_sync_unless

IGNORE_INDEX = -100


@dataclass(frozen=True, slots=True, kw_only=True)
class StepLoss:
    local_loss_sum: torch.Tensor
    """Sum of token losses on this rank (detached)."""
    global_tokens: int
    """Target tokens over all ranks and micro-batches of the step."""


def count_global_tokens(micro_batches: list, *, dp: int, device: torch.device,
                        dp_group=None) -> int:
    """Target tokens of the step summed over the dp ranks (over `dp_group`; None = world)."""
    local = sum(int((targets != IGNORE_INDEX).sum()) for _, targets in micro_batches)
    if dp == 1:
        return local
    t = torch.tensor([local], dtype=torch.int64, device=device)
    dist.all_reduce(t, group=dp_group)
    return int(t.item())


def token_loss_sum(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                   autocast) -> torch.Tensor:
    with autocast:
        logits = model(inputs)
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def forward_backward(model: torch.nn.Module, micro_batches: list, *, dp: int,
                     device: torch.device, autocast, scaler=None, dp_group=None) -> StepLoss:
    """Accumulate gradients of (sum of token losses over the global batch) / global tokens.

    DDP averages gradients over the dp ranks, so each rank scales its loss by dp to undo that
    average: the result equals one process computing the mean over the whole global batch.
    """
    global_tokens = count_global_tokens(micro_batches, dp=dp, device=device, dp_group=dp_group)
    total = torch.zeros((), dtype=torch.float32, device=device)
    last = len(micro_batches) - 1
    for i, (inputs, targets) in enumerate(micro_batches):
        inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with no_sync_unless(model, sync=i == last):
            loss_sum = token_loss_sum(model, inputs, targets, autocast)
            scaled = loss_sum * (dp / global_tokens)
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        total += loss_sum.detach()
    return StepLoss(local_loss_sum=total, global_tokens=global_tokens)


def clip_and_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, grad_clip: float,
                  scaler=None) -> float:
    """Unscale (fp16), clip the global gradient norm, step, zero grads; return the norm."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    max_norm = grad_clip if grad_clip > 0 else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
