"""The one-update protocol and its single-process check: gradient accumulation equals one big
batch. Every layout (DDP, ZeRO, TP, PP, CP and their combinations) is checked against one
process in test_layout_parity.py and test_pipeline_parity.py with these tolerances."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from conf.spec import RunSpec
from tests.support.specs import cpu_spec

ATOL, RTOL = 5e-6, 1e-4
pytestmark = pytest.mark.distributed


# AdamW's first step moves each weight by lr * g / (|g| + eps): where |g| is near eps (1e-8)
# its slope is ~lr / eps, so reduction-order noise of 1e-10 in a gradient becomes lr * 1e-2 in
# the parameter. At lr=3e-3 that is ~7e-6 (seen here), at lr=1e-4 ~3e-7: the parity tests use
# the small LR so the parameter check measures the parallel code, not that amplification.
PARITY_LR = "optim.lr=1e-4"


def synthetic_spec(*overrides: str) -> RunSpec:
    return cpu_spec("model=tiny", "data=synthetic", "training.seq_len=32",
                    "cluster.procs_per_node=2", PARITY_LR, *overrides)


def one_update(model, micro_batches, spec: RunSpec):
    """Loss, logits of the micro-batches, grads and post-step params of one real step."""
    from training.parallel_model import ParallelModel
    from training.optim import build_optimizer
    from training.step import clip_and_step, forward_backward

    optimizer = build_optimizer(model, optim=spec.optim)
    layout = ParallelModel.single(model)
    loss = forward_backward(layout, micro_batches, device=torch.device("cpu"),
                            autocast=torch.autocast("cpu", enabled=False))
    with torch.no_grad():
        logits = [model(inputs) for inputs, _ in micro_batches]
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    clip_and_step(layout, [optimizer], grad_clip=spec.optim.grad_clip)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return loss, torch.cat(logits), grads, params


def reference_batches(spec: RunSpec):
    """The whole global batch as one micro-batch of one process."""
    from training.data.build import build_train_batches

    t = dataclasses.replace(spec.training, micro_batch_size=spec.training.global_batch_size,
                            grad_accum_steps=1)
    return build_train_batches(spec.data, t, dp_rank=0, dp_size=1).next_step()


def test_gradient_accumulation_matches_one_big_batch():
    """One process: 4 micro-batches of 2 accumulate to the gradients of one batch of 8."""
    from training.data.build import build_train_batches
    from training.model import build_model

    spec = cpu_spec("model=tiny", "data=synthetic", "training.seq_len=32", "parallel=single", PARITY_LR,
                    "training.micro_batch_size=2", "training.grad_accum_steps=4")
    accumulated = build_train_batches(spec.data, spec.training, dp_rank=0, dp_size=1).next_step()
    assert len(accumulated) == 4
    results = []
    for batches in (accumulated, reference_batches(spec)):
        model = build_model(spec.model, device=torch.device("cpu"), seed=spec.training.seed)
        results.append(one_update(model, batches, spec))
    (loss_a, _, grads_a, params_a), (loss_b, _, grads_b, params_b) = results
    assert loss_a.global_tokens == loss_b.global_tokens == 8 * 32
    torch.testing.assert_close(loss_a.local_loss_sum, loss_b.local_loss_sum, atol=1e-4, rtol=1e-6)
    for name in grads_b:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=ATOL, rtol=RTOL, msg=name)
        torch.testing.assert_close(params_a[name], params_b[name], atol=ATOL, rtol=RTOL, msg=name)
