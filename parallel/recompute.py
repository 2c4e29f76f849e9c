"""Activation recompute (activation checkpointing) per transformer block.

- none: keep every activation autograd saves.
- full: keep only each block's input; re-run the whole block in backward.
- selective: per-op policy that keeps matmul and attention outputs and re-computes the cheap
  element-wise work (norms, RoPE, SiLU, products, copies) in backward.

The block is not wrapped in another module: its class is swapped for a subclass whose forward
runs the original forward under `torch.utils.checkpoint` (the way FSDP2's `fully_shard` swaps
classes). Parameter names and state-dict keys stay exactly as they were, so checkpoints, export,
TP plans and FSDP see the same names with or without recompute.
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from conf.schema import RecomputeMode
from conf.spec import RecomputeSpec


def apply_recompute(model: nn.Module, *, recompute: RecomputeSpec) -> None:
    """Make every block in `model.layers` recompute its activations in backward, in place."""
    mode = RecomputeMode(recompute.mode)
    if mode is RecomputeMode.none:
        return
    for block in _blocks(model):
        assert not isinstance(block, _RecomputeBlock), "recompute applied twice"
        block.__class__ = _recompute_class(type(block))
        block.recompute_mode = mode


def save_matmuls_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Selective policy: keep matmul/attention/TP-collective outputs, recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op in _saved_ops() else CheckpointPolicy.PREFER_RECOMPUTE


def selective_context_fn():
    """Fresh (forward, recompute) contexts for one checkpointed call, using the policy above."""
    return create_selective_checkpoint_contexts(save_matmuls_policy)


class _RecomputeBlock:
    """Mixin placed in front of a block's class; `recompute_mode` is set per instance."""

    recompute_mode: RecomputeMode

    def forward(self, *args, **kwargs):
        if self.recompute_mode is RecomputeMode.selective:
            # context_fn only when needed: torch.compile rejects an explicit noop_context_fn.
            return checkpoint(super().forward, *args, use_reentrant=False,
                              context_fn=selective_context_fn, **kwargs)
        return checkpoint(super().forward, *args, use_reentrant=False, **kwargs)


@functools.cache
def _recompute_class(block_class: type) -> type:
    return type(f"Recompute{block_class.__name__}", (_RecomputeBlock, block_class), {})


@functools.cache
def _saved_ops() -> frozenset:
    aten = torch.ops.aten
    names = [
        "mm", "addmm", "bmm", "_scaled_mm",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable",
    ]
    ops = {getattr(aten, name).default for name in names if hasattr(aten, name)}
    c10d = getattr(torch.ops, "_c10d_functional", None)
    if c10d is not None and hasattr(c10d, "reduce_scatter_tensor"):
        ops.add(c10d.reduce_scatter_tensor.default)  # SP outputs: never re-communicate
    return frozenset(ops)


def _blocks(model: nn.Module) -> list[nn.Module]:
    layers = model.layers
    return list(layers.values() if isinstance(layers, nn.ModuleDict) else layers)
