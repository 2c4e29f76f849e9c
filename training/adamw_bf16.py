"""AdamW whose moment estimates are stored in bf16 (half the optimizer memory of fp32).

The update is computed in fp32 from the bf16 moments and applied to the fp32 parameters
(the master weights); only the stored moments are rounded. Same formula as torch.optim.AdamW
(decoupled weight decay, bias correction).
"""
from __future__ import annotations

import math

import torch


class AdamWBf16State(torch.optim.Optimizer):
    def __init__(self, params, *, lr: float, betas: tuple[float, float], eps: float):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=0.0))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group, beta1=beta1, beta2=beta2)
        return None

    def _update(self, param: torch.Tensor, group: dict, *, beta1: float, beta2: float) -> None:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.bfloat16)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.bfloat16)
        state["step"] += 1
        step = float(state["step"])
        grad = param.grad.float()
        exp_avg = state["exp_avg"].float().lerp_(grad, 1 - beta1)
        exp_avg_sq = state["exp_avg_sq"].float().mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        state["exp_avg"].copy_(exp_avg)
        state["exp_avg_sq"].copy_(exp_avg_sq)
        lr = group["lr"]
        param.mul_(1 - lr * group["weight_decay"])
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - beta2 ** step)).add_(group["eps"])
        param.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1 ** step))
