"""The one-update protocol and its single-process check: gradient accumulation equals one big
batch. Every layout (DDP, ZeRO, TP, PP, CP and their combinations) is checked against one
process in test_layout_parity.py and test_pipeline_parity.py with these tolerances
(tests/support/layout_parity.py)."""
from __future__ import annotations

import pytest
import torch

from conf.spec import RunSpec
from tests.support.layout_parity import ATOL, RTOL, reference_batches
from tests.support.specs import PARITY_LR, cpu_spec

pytestmark = pytest.mark.distributed


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


def test_gradient_accumulation_matches_one_big_batch():
    """One process: 4 micro-batches of 2 accumulate to the gradients of one batch of 8."""
    from training.data.build import build_train_batches
    from training.model_builder import build_model

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
