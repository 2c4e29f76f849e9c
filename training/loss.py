"""The training loss, one formula for every path (plain, tensor-parallel, pipeline stages),
and the same loss with the output head run a row block at a time (`training.loss_chunks`);
the output heads any model family can use, untied (`OutputHead`) or tied to the embedding
(`TiedHead`)."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

IGNORE_INDEX = -100


def token_cross_entropy_sum(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over target tokens (IGNORE_INDEX excluded) of the cross entropy, in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                           ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_head_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          *, chunks: int) -> torch.Tensor:
    """`token_cross_entropy_sum(F.linear(hidden, weight), targets)` without the whole
    [B, T, vocab] logits: the head and the loss run on `chunks` row blocks in turn, and when
    gradients are wanted each block's (of its hidden rows and of the weight) are taken at
    once, so only one block's logits are ever alive. A block computes what the whole path
    computes for its rows (the same casts under autocast or FSDP's compute dtype); the
    weight's gradient is the fp32 sum of the blocks' (one matmul over all rows in the whole
    path), so the two agree to rounding. One autograd node: DDP and FSDP see one gradient
    per parameter per backward, as without chunks."""
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ChunkedHeadLoss.apply(hidden, weight, targets, chunks)
    rows, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    return sum(_block_loss(rows[block], weight, flat_targets[block])
               for block in row_blocks(rows.shape[0], chunks))


def row_blocks(rows: int, chunks: int) -> list[slice]:
    """Consecutive slices of ceil(rows / chunks) rows covering `rows` (the last one shorter
    if uneven): `chunks` of them, or fewer when the rounding up covers the rows sooner."""
    size = -(-rows // chunks)
    return [slice(start, min(start + size, rows)) for start in range(0, rows, size)]


def _block_loss(rows: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The whole path's formula on one block: [rows, dim] as one [1, rows, dim] sequence."""
    return token_cross_entropy_sum(F.linear(rows, weight).unsqueeze(0), targets.unsqueeze(0))


class _ChunkedHeadLoss(torch.autograd.Function):
    """forward: the loss sum, the gradients of that sum computed block by block and kept;
    backward: those gradients times the incoming scalar (the step's loss scale)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunks):
        rows, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        grad_rows = torch.empty_like(rows)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        with torch.enable_grad():
            # One leaf for every block: autocast caches one cast of it, as of the weight in
            # the whole path.
            leaf_weight = weight.detach().requires_grad_()
            for block in row_blocks(rows.shape[0], chunks):
                leaf_rows = rows[block].detach().requires_grad_()
                loss = _block_loss(leaf_rows, leaf_weight, flat_targets[block])
                d_rows, d_weight = torch.autograd.grad(loss, (leaf_rows, leaf_weight))
                grad_rows[block] = d_rows
                grad_weight += d_weight
                total += loss.detach()
        ctx.hidden_shape = hidden.shape
        ctx.grads = grad_rows, grad_weight.to(weight.dtype)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_rows, grad_weight = ctx.grads
        ctx.grads = None
        grad_hidden = (grad_rows * grad_total.to(grad_rows.dtype)).reshape(ctx.hidden_shape)
        grad_weight = grad_weight * grad_total.to(grad_weight.dtype)
        return (grad_hidden if ctx.needs_input_grad[0] else None,
                grad_weight if ctx.needs_input_grad[1] else None, None, None)


class OutputHead(nn.Linear):
    """An untied output head any model family can use: hidden states -> logits, or with
    `targets` their loss sum in row blocks. Its forward runs once per model forward either
    way, as FSDP's head unit expects (one gather, one reduce-scatter)."""

    def __init__(self, dim: int, vocab_size: int):
        super().__init__(dim, vocab_size, bias=False)

    def forward(self, hidden: torch.Tensor, *, targets: torch.Tensor | None = None,
                loss_chunks: int = 1) -> torch.Tensor:
        if targets is None:
            return super().forward(hidden)
        return chunked_head_loss_sum(hidden, self.weight, targets, chunks=loss_chunks)


class TiedHead(nn.Module):
    """The output head of a model whose embedding is tied: no weight of its own, the
    embedding's is passed in. A module of its own, so the passes can shape it like an
    untied head: tensor parallelism makes its input whole and, with the vocabulary-sharded
    embedding weight, gives vocabulary-sharded logits (parallel/tied_embeddings.py)."""

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, *,
                targets: torch.Tensor | None = None, loss_chunks: int = 1) -> torch.Tensor:
        if targets is None:
            return F.linear(hidden, weight)
        return chunked_head_loss_sum(hidden, weight, targets, chunks=loss_chunks)
