"""A decoder with mixture-of-experts feed-forwards (Qwen3-MoE, Mixtral, DeepSeek-V3-style
blocks), built from a `ModelSpec` whose `moe.num_experts` > 0.

Attention, norms, RoPE, embedding and head are the Llama family's (training/models/llama/
model.py; q/k norms with model.qk_norm). Blocks 0 .. moe.first_dense_layers-1 keep a dense
SwiGLU (`feed_forward`); the others hold `moe` (training/models/moe/model/moe_layer.py). The
forward is the dense family's; the router losses of the last forward are `router_losses()`,
which the training step adds to the loss (training/step.py), or, on a pipeline stage, the
stage's output carries their gradient (`pipeline_microbatch`, router_loss_grad.py).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from conf.spec import ModelSpec
from training.models.llama.model import (Attention, FeedForward, RMSNorm, Transformer,
                                         TransformerBlock)
from training.models.moe.model.moe_layer import MoE
from training.models.moe.model.router_loss_grad import with_router_loss_grad


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
        self._pipeline_weight = None

    def moe_layers(self) -> dict[int, MoE]:
        """The MoE feed-forwards this module (or pipeline stage) holds, by block index."""
        return {int(i): block.moe for i, block in self.layers.items() if hasattr(block, "moe")}

    def router_losses(self) -> torch.Tensor | None:
        """The weighted router losses of the last forward, averaged over the model's MoE
        blocks: a pipeline stage's share is its blocks' sum / all the model's MoE blocks
        (None when this stage has none, nothing was computed or both coefficients are 0)."""
        losses = [m.router_losses for m in self.moe_layers().values()
                  if m.router_losses is not None]
        if not losses or not (self.spec.moe.aux_loss_coef or self.spec.moe.z_loss_coef):
            return None
        blocks = sum(self.spec.is_moe_block(i) for i in range(self.spec.n_layers))
        return torch.stack(losses).sum() / blocks

    def forward(self, tokens: torch.Tensor, **kwargs) -> torch.Tensor:
        """The dense family's forward; in a pipeline stage's real forward
        (`pipeline_microbatch`) with gradients on, the output also carries this stage's
        router losses' gradient (router_loss_grad.py)."""
        out = super().forward(tokens, **kwargs)
        weight = self._pipeline_weight
        losses = self.router_losses() if weight is not None and torch.is_grad_enabled() else None
        return out if losses is None else with_router_loss_grad(out, losses, weight)

    def as_pipeline_stage(self) -> None:
        """This module is a pipeline stage (parallel/pipeline.py): its router losses reach the
        gradient, and its loads are counted, only in forwards inside `pipeline_microbatch`
        (not in torch's shape-inference forward)."""
        for moe in self.moe_layers().values():
            moe.counts_loads = False

    @contextlib.contextmanager
    def pipeline_microbatch(self, weight):
        """Inside: the stage's real forward of one pipeline micro-batch, whose router losses
        enter the trained loss x `weight` (the micro-batch's target tokens x the step's loss
        scale, as training/router_losses.py weighs them; None: a forward without gradient)."""
        layers = self.moe_layers().values()
        self._pipeline_weight = weight
        for moe in layers:
            moe.counts_loads = True
        try:
            yield
        finally:
            self._pipeline_weight = None
            for moe in layers:
                moe.counts_loads = False

    @torch.no_grad()
    def reset_rope_tables(self) -> None:
        super().reset_rope_tables()
        for moe in self.moe_layers().values():
            moe.reset_stats()
            if moe.expert_bias is not None:
                moe.expert_bias.zero_()
