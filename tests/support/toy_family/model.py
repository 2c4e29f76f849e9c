"""The toy family's module (see __init__.py): GPT-2-style blocks without position embedding.

Keeps the module contract of training/models/family.py: blocks in `layers` keyed "0", "1", ...;
`wte` / `ln_f` and `lm_head` may be None in a pipeline stage; `rope_positions` and
`document_mask` for context parallelism (no RoPE here: positions are not used), and a
`context` on each block's `attn`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from conf.spec import ModelSpec
from parallel.document_masking import local_document_mask, masked_attention
from training.loss import OutputHead, TiedHead


class ToyAttention(nn.Module):
    """Causal multi-head attention; c_attn's output features are per head [q, k, v] (so a
    column split over tp ranks keeps whole heads)."""

    def __init__(self, model: ModelSpec):
        super().__init__()
        self.head_dim = model.head_dim
        self.c_attn = nn.Linear(model.dim, 3 * model.dim)
        self.c_proj = nn.Linear(model.dim, model.dim)
        self.context = None

    def forward(self, x: torch.Tensor, *, mask=None) -> torch.Tensor:
        batch, seq, _ = x.shape
        qkv = self.c_attn(x).view(batch, seq, -1, 3, self.head_dim)
        q, k, v = (qkv[:, :, :, part].transpose(1, 2) for part in range(3))
        out = self.core_attention(q, k, v, mask=mask)
        return self.c_proj(out.transpose(1, 2).reshape(batch, seq, -1))

    def core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                       mask=None) -> torch.Tensor:
        if self.context is not None:
            return self.context(q, k, v, mask=mask)
        if mask is not None:
            return masked_attention(q, k, v, mask=mask)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class ToyMLP(nn.Module):
    def __init__(self, model: ModelSpec):
        super().__init__()
        self.c_fc = nn.Linear(model.dim, model.ffn_dim)
        self.c_proj = nn.Linear(model.ffn_dim, model.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class ToyBlock(nn.Module):
    def __init__(self, model: ModelSpec):
        super().__init__()
        self.ln_1 = nn.LayerNorm(model.dim, eps=model.norm_eps)
        self.attn = ToyAttention(model)
        self.ln_2 = nn.LayerNorm(model.dim, eps=model.norm_eps)
        self.mlp = ToyMLP(model)

    def forward(self, x: torch.Tensor, mask=None) -> torch.Tensor:
        h = x + self.attn(self.ln_1(x), mask=mask)
        return h + self.mlp(self.ln_2(h))


class ToyGPT(nn.Module):
    def __init__(self, model: ModelSpec):
        super().__init__()
        self.spec = model
        self.wte = nn.Embedding(model.vocab_size, model.dim)
        self.layers = nn.ModuleDict({str(i): ToyBlock(model) for i in range(model.n_layers)})
        self.ln_f = nn.LayerNorm(model.dim, eps=model.norm_eps)
        self.lm_head = TiedHead() if model.tie_embeddings else OutputHead(model.dim,
                                                                           model.vocab_size)
        self.rope_positions: torch.Tensor | None = None

    document_mask = staticmethod(local_document_mask)

    def forward(self, tokens: torch.Tensor, *, doc_ids: torch.Tensor | None = None,
                doc_positions: torch.Tensor | None = None, targets: torch.Tensor | None = None,
                loss_chunks: int = 1) -> torch.Tensor:
        mask = None if doc_ids is None else self.document_mask(doc_ids)
        h = tokens if tokens.is_floating_point() else self.wte(tokens)  # a later stage's input
        for block in self.layers.values():
            h = block(h, mask=mask)
        if self.ln_f is None:
            return h
        h = self.ln_f(h)
        if self.spec.tie_embeddings:
            return self.lm_head(h, self.wte.weight, targets=targets, loss_chunks=loss_chunks)
        return self.lm_head(h, targets=targets, loss_chunks=loss_chunks)

    def reset_rope_tables(self) -> None:
        """No RoPE tables: nothing to re-compute after materialising."""
