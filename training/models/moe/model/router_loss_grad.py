"""Router losses on a pipeline stage: their gradient rides on the stage's output.

torch's pipeline schedule backpropagates only the last stage's loss; a stage hands on its
output and gets that output's gradient back. `with_router_loss_grad(hidden, loss, weight)`
is `hidden` in forward; in backward it passes the incoming gradient through unchanged and
gives `loss` the gradient `weight`, so the loss's own graph (router logits, probabilities)
receives d(weight x loss) exactly as if `weight x loss` had been added to the training loss.
The autograd engine runs that graph as part of the stage's backward: a split backward
(input gradients first, weight gradients later: zero-bubble schedules) sees it like any
other path, and torch's shape-inference backward (gradients of the stage inputs only)
writes no parameter gradient.
"""
from __future__ import annotations

import torch


class RouterLossGrad(torch.autograd.Function):
    """Identity on `hidden`; backward: the gradient of `hidden` as it came, `weight` for
    `loss` (a 0-dim tensor, or a float)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, loss: torch.Tensor, weight) -> torch.Tensor:
        ctx.weight = weight
        ctx.loss_meta = (loss.shape, loss.dtype)
        # The same storage, as a new tensor rather than a view: torch's split backward
        # (zero-bubble schedules) detaches stage outputs in place, which a view refuses.
        return hidden.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        shape, dtype = ctx.loss_meta
        weight = torch.as_tensor(ctx.weight, dtype=dtype, device=grad.device)
        return grad, weight.expand(shape), None


def with_router_loss_grad(hidden: torch.Tensor, loss: torch.Tensor, weight) -> torch.Tensor:
    """`hidden`, whose backward also backpropagates `weight` x `loss`."""
    return RouterLossGrad.apply(hidden, loss, weight)
