"""The torch-free accounting against real tensors: parameter counts and static memory."""
from __future__ import annotations

import pytest
import torch

from tests.support.specs import cpu_spec
from training.accounting import estimate_memory, param_counts
from training.layout import RankLayout
from training.model import build_model, count_params
from training.optim import build_optimizer
from training.step import clip_and_step, forward_backward


@pytest.mark.parametrize("tied", [False, True])
def test_param_counts_match_the_built_model(tied):
    spec = cpu_spec("model=debug", f"model.tie_embeddings={str(tied).lower()}")
    model = build_model(spec.model, device=torch.device("meta"), seed=0)
    total, embedding = count_params(model)
    counts = param_counts(spec.model)
    assert (counts.total, counts.embedding) == (total, embedding)


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def test_static_memory_estimate_matches_bytes_held_after_a_step():
    spec = cpu_spec("model=tiny", "data=synthetic", "parallel=single", "training.seq_len=16",
                    "training.micro_batch_size=2")
    model = build_model(spec.model, device=torch.device("cpu"), seed=0)
    optimizer = build_optimizer(model, optim=spec.optim)
    batch = [(torch.randint(0, 256, (2, 16)), torch.randint(0, 256, (2, 16)))]
    layout = RankLayout.single(model)
    forward_backward(layout, batch, device=torch.device("cpu"),
                     autocast=torch.autocast("cpu", enabled=False))
    grads = tensor_bytes(p.grad for p in model.parameters())
    clip_and_step(layout, [optimizer], grad_clip=1.0)
    estimate = estimate_memory(spec)
    held_optimizer = sum(tensor_bytes(state.values()) for state in optimizer.state.values())
    assert tensor_bytes(model.parameters()) == estimate.params
    assert grads == estimate.grads
    assert held_optimizer == estimate.optimizer  # two moments per element + a step per tensor
