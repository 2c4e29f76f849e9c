"""Dynamic loss scaling for fp16 that stays right when gradients are sharded.

torch's GradScaler decides "skip this step" from the gradients a rank holds; with FSDP or
tensor-parallel shards, ranks would disagree and their weights would drift apart. Here every
rank checks its own shards, then all ranks take the maximum (any overflow anywhere skips the
step everywhere).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


class DynamicLossScaler:
    """Multiply the loss by `scale_factor`; halve it on overflow, double it after
    `growth_interval` clean steps."""

    def __init__(self, *, init_scale: float, growth_interval: int = 2000):
        self.scale_factor = float(init_scale)
        self.growth_interval = growth_interval
        self.clean_steps = 0
        self.found_inf = False

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_factor

    @torch.no_grad()
    def unscale_(self, params: list[torch.Tensor]) -> None:
        """Divide gradients by the scale and agree, over all ranks, whether any overflowed."""
        grads = [p.grad for p in params if p.grad is not None]
        local_bad = torch.zeros((), dtype=torch.float32,
                                device=grads[0].device if grads else "cpu")
        for grad in grads:
            grad.mul_(1.0 / self.scale_factor)
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            local_bad = torch.maximum(local_bad, (~torch.isfinite(local)).any().float())
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(local_bad, op=dist.ReduceOp.MAX)
        self.found_inf = bool(local_bad.item())

    def update(self) -> bool:
        """After unscale_: adjust the scale; True when the optimizer should step."""
        if self.found_inf:
            self.scale_factor *= 0.5
            self.clean_steps = 0
            return False
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.scale_factor *= 2.0
            self.clean_steps = 0
        return True

    def state_dict(self) -> dict:
        return {"scale": self.scale_factor, "clean_steps": self.clean_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale_factor = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
