"""The toy MoE family's module (see __init__.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from conf.spec import ModelSpec
from tests.support.toy_family.model import ToyAttention, ToyGPT
from tests.support.toy_moe_family import N_EXPERTS, TOP_K, Z_LOSS


class GroupedExperts(nn.Module):
    """SwiGLU experts; each runs on its contiguous slice of the sorted token copies (a loop:
    the CPU path)."""

    def __init__(self, dim: int, ffn_dim: int, n_experts: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(n_experts, ffn_dim, dim))
        self.w2 = nn.Parameter(torch.empty(n_experts, dim, ffn_dim))
        self.w3 = nn.Parameter(torch.empty(n_experts, ffn_dim, dim))

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        outs, start = [], 0
        for e, n in enumerate(counts.tolist()):
            rows = x[start:start + n]
            outs.append((F.silu(rows @ self.w1[e].T) * (rows @ self.w3[e].T)) @ self.w2[e].T)
            start += n
        return torch.cat(outs) if outs else x.new_empty(0, self.w2.shape[1])


class ToyMoELayer(nn.Module):
    def __init__(self, model: ModelSpec):
        super().__init__()
        self.router = nn.Linear(model.dim, N_EXPERTS, bias=False)
        self.experts = GroupedExperts(model.dim, model.ffn_dim, N_EXPERTS)
        self.aux_loss_sum: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        logits = self.router(tokens)
        self.aux_loss_sum = Z_LOSS * torch.logsumexp(logits, dim=-1).square().sum()
        weights, chosen = torch.topk(logits.softmax(dim=-1), TOP_K, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        flat = chosen.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=N_EXPERTS)
        out_sorted = self.experts(tokens[order // TOP_K], counts)
        out = torch.empty_like(out_sorted).index_copy(0, order, out_sorted)
        combined = (out.view(-1, TOP_K, shape[-1]) * weights.unsqueeze(-1)).sum(dim=1)
        return combined.view(shape)


class ToyMoEBlock(nn.Module):
    def __init__(self, model: ModelSpec):
        super().__init__()
        self.ln_1 = nn.LayerNorm(model.dim, eps=model.norm_eps)
        self.attn = ToyAttention(model)
        self.ln_2 = nn.LayerNorm(model.dim, eps=model.norm_eps)
        self.moe = ToyMoELayer(model)

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        h = x + self.attn(self.ln_1(x), mask=mask)
        return h + self.moe(self.ln_2(h))


class ToyMoE(ToyGPT):
    def __init__(self, model: ModelSpec):
        super().__init__(model)
        self.layers = nn.ModuleDict({str(i): ToyMoEBlock(model) for i in range(model.n_layers)})

    def forward(self, tokens, *, targets=None, **kwargs):
        out = super().forward(tokens, targets=targets, **kwargs)
        if targets is None or self.ln_f is None:
            return out
        return out + sum(block.moe.aux_loss_sum for block in self.layers.values())
