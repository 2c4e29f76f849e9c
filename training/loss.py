"""The training loss, one formula for every path (plain, tensor-parallel, pipeline stages)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def token_cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over target tokens (IGNORE_INDEX excluded) of the cross entropy, in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                           ignore_index=IGNORE_INDEX, reduction="sum")
