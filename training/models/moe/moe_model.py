"""A decoder with mixture-of-experts feed-forwards (Qwen3-MoE, Mixtral, DeepSeek-V3-style
blocks), built from a `ModelSpec` whose `moe.num_experts` > 0.

Attention, norms, RoPE, embedding and head are the Llama family's (training/models/llama/
model.py; q/k norms with model.qk_norm). Blocks 0 .. moe.first_dense_layers-1 keep a dense
SwiGLU (`feed_forward`); the others hold `moe` (training/models/moe/moe_layer.py). The
forward is the dense family's; the router losses of the last forward are `router_losses()`,
which the training step adds to the loss (training/step.py).
"""
from __future__ import annotations

import torch
from torch import nn

from conf.spec import ModelSpec
from training.models.llama.model import (Attention, FeedForward, RMSNorm, Transformer,
                                         TransformerBlock)
from training.models.moe.moe_layer import MoE


class MoeBlock(TransformerBlock):
    """Pre-norm block: x + attention(norm(x)), then + (moe or feed_forward)(norm(.))."""

    def __init__(self, model: ModelSpec, index: int):
        nn.Module.__init__(self)
        self.attention_norm = RMSNorm(model.dim, eps=model.norm_eps)
        self.attention = Attention(model)
        self.ffn_norm = RMSNorm(model.dim, eps=model.norm_eps)
        if model.is_moe_block(index):
            self.moe = MoE(model)
        else:
            self.feed_forward = FeedForward(model)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask=None) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos=cos, sin=sin, mask=mask)
        ffn = self.moe if hasattr(self, "moe") else self.feed_forward
        return h + ffn(self.ffn_norm(h))


class MoeTransformer(Transformer):
    """Decoder-only language model with MoE blocks: tokens [B, T] -> logits [B, T, vocab]."""

    def __init__(self, model: ModelSpec):
        super().__init__(model)
        self.layers = nn.ModuleDict({str(i): MoeBlock(model, i) for i in range(model.n_layers)})

    def moe_layers(self) -> dict[int, MoE]:
        """The MoE feed-forwards this module (or pipeline stage) holds, by block index."""
        return {int(i): block.moe for i, block in self.layers.items() if hasattr(block, "moe")}

    def router_losses(self) -> torch.Tensor | None:
        """The weighted router losses of the last forward, averaged over the MoE blocks
        (None when this stage has none or nothing was computed)."""
        losses = [m.router_losses for m in self.moe_layers().values()
                  if m.router_losses is not None]
        return torch.stack(losses).mean() if losses else None

    @torch.no_grad()
    def reset_rope_tables(self) -> None:
        super().reset_rope_tables()
        for moe in self.moe_layers().values():
            moe.reset_stats()
            if moe.expert_bias is not None:
                moe.expert_bias.zero_()
