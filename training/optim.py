"""AdamW with weight decay only on weights with 2 or more dims."""
from __future__ import annotations

import torch

from conf.spec import OptimSpec


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, *, optim: OptimSpec) -> torch.optim.Optimizer:
    return torch.optim.AdamW(param_groups(model, optim.weight_decay), lr=optim.lr,
                             betas=(optim.beta1, optim.beta2), eps=optim.eps)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
