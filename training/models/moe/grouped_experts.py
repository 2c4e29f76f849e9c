"""The routed experts of one MoE block as three 3-D weights, computed group by group.

`GroupedExperts.forward(x, counts)` takes the token copies sorted by expert (x [M, dim], the
first counts[0] rows for expert 0, the next counts[1] for expert 1, ...) and returns each row
through its expert's SwiGLU: w2_e(silu(w1_e x) * w3_e x). It depends only on (x, counts) and
its weights, so expert parallelism can wrap it (all-to-all in, the local experts, all-to-all
out). On CUDA in bf16 the three matmuls are torch's grouped GEMM (`torch._grouped_mm`, offsets
on the device: no host sync); elsewhere one matmul per expert over its slice (the split sizes
are read once on the host; on CPU that costs nothing).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

GROUPED_MM_ALIGN = 16
"""torch._grouped_mm needs each group's row offset to be a multiple of 16 bytes / element."""


class GroupedExperts(nn.Module):
    """num_experts SwiGLU experts: w1 [E, ffn, dim] (gate), w3 [E, ffn, dim] (up),
    w2 [E, dim, ffn] (down); Hugging Face's per-expert gate_proj / up_proj / down_proj."""

    def __init__(self, *, num_experts: int, dim: int, ffn_dim: int):
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, ffn_dim, dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, ffn_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, ffn_dim))

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x [M, dim] sorted by expert, counts [E] (int64, sum M) -> [M, dim]."""
        if use_grouped_mm(x, self.w1):
            return _grouped(x, counts, self.w1, self.w2, self.w3)
        return _looped(x, counts, self.w1, self.w2, self.w3)


def use_grouped_mm(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Grouped GEMM where torch has it for these tensors: CUDA (compute capability >= 9.0),
    bf16, widths aligned."""
    if not (x.is_cuda and hasattr(torch, "_grouped_mm") and x.dtype == torch.bfloat16
            and weight.dtype == torch.bfloat16):
        return False
    major, _ = torch.cuda.get_device_capability(x.device)
    return major >= 9 and all(size % 8 == 0 for size in weight.shape[1:])


def _grouped(x, counts, w1, w2, w3) -> torch.Tensor:
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    gate = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offsets)
    up = torch._grouped_mm(x, w3.transpose(-2, -1), offs=offsets)
    return torch._grouped_mm(F.silu(gate) * up, w2.transpose(-2, -1), offs=offsets)


def _looped(x, counts, w1, w2, w3) -> torch.Tensor:
    outputs = []
    for expert, rows in enumerate(torch.split(x, counts.tolist(), dim=0)):
        hidden = F.silu(rows @ w1[expert].t()) * (rows @ w3[expert].t())
        outputs.append(hidden @ w2[expert].t())
    return torch.cat(outputs, dim=0) if outputs else x.new_zeros(x.shape)
