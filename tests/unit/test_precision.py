"""bf16 and fp16 code paths on CPU (slow there, but correct, so they are tested here)."""
from __future__ import annotations

import pytest
import torch

from tests.support.specs import cpu_spec
from training.data.build import build_train_batches
from training.parallel_model import ParallelModel
from training.model_builder import build_model
from training.optim import build_optimizer
from training.precision import autocast_context, build_grad_scaler
from training.step import clip_and_step, forward_backward


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_training_learns_with_fp32_master_weights(precision):
    spec = cpu_spec("model=tiny", "data=synthetic", "parallel=single", "training.seq_len=32",
                    "training.micro_batch_size=4", f"precision={precision}")
    assert spec.precision.compute_dtype.value == precision
    device = torch.device("cpu")
    model = build_model(spec.model, device=device, seed=0)
    optimizer = build_optimizer(model, optim=spec.optim)
    scaler = build_grad_scaler(spec.precision)
    layout = ParallelModel.single(model)
    assert (scaler is not None) == (precision == "fp16")
    batches = build_train_batches(spec.data, spec.training, dp_rank=0, dp_size=1).next_step()
    losses = []
    for _ in range(8):  # the same batch: the loss must fall
        loss = forward_backward(layout, batches, device=device,
                                autocast=autocast_context(spec.precision, device), scaler=scaler)
        losses.append(float(loss.local_loss_sum) / loss.global_tokens)
        clip_and_step(layout, [optimizer], grad_clip=1.0, scaler=scaler)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses[-1] < losses[0] - 0.1, losses
    if scaler is not None:
        assert scaler.scale_factor > 0 and scaler.state_dict()["scale"] > 0
