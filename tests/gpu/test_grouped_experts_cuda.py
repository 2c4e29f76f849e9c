"""On a CUDA GPU of compute capability >= 9.0 in bf16 the experts run as torch's grouped GEMM
(torch._grouped_mm), and its outputs and gradients equal the per-expert loop's, with empty
and uneven groups; under bf16 autocast with fp32 weights and input it is the grouped GEMM too."""
from __future__ import annotations

import pytest
import torch

from training.models.moe.model import grouped_experts
from training.models.moe.model.grouped_experts import GroupedExperts, use_grouped_mm

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_grouped_gemm_equals_the_loop_in_bf16():
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("torch._grouped_mm needs compute capability >= 9.0")
    torch.manual_seed(0)
    experts = GroupedExperts(num_experts=8, dim=256, ffn_dim=512).cuda().bfloat16()
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.05)
    counts = torch.tensor([0, 37, 5, 0, 128, 64, 1, 21], device="cuda")
    x = torch.randn(int(counts.sum()), 256, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    assert use_grouped_mm(x, experts.w1, dtype=x.dtype)
    grouped = experts(x, counts)
    grouped.float().pow(2).sum().backward()
    grads = [t.grad.clone() for t in (x, experts.w1, experts.w2, experts.w3)]
    for t in (x, experts.w1, experts.w2, experts.w3):
        t.grad = None
    looped = grouped_experts._looped(x, counts, experts.w1, experts.w2, experts.w3)
    looped.float().pow(2).sum().backward()
    torch.testing.assert_close(grouped, looped, atol=2e-2, rtol=2e-2)
    for got, want in zip(grads, (x.grad, experts.w1.grad, experts.w2.grad, experts.w3.grad)):
        torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)


def test_bf16_autocast_with_fp32_weights_takes_the_grouped_gemm(monkeypatch):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("torch._grouped_mm needs compute capability >= 9.0")
    experts = GroupedExperts(num_experts=4, dim=64, ffn_dim=128).cuda()
    with torch.no_grad():
        for p in experts.parameters():
            p.normal_(0, 0.05)
    calls = []
    real = grouped_experts._grouped
    monkeypatch.setattr(grouped_experts, "_grouped",
                        lambda *args: calls.append(args[0].dtype) or real(*args))
    x = torch.randn(40, 64, device="cuda", requires_grad=True)  # fp32, as autocast passes it
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = experts(x, torch.tensor([10, 0, 25, 5], device="cuda"))
    out.float().sum().backward()
    assert calls == [torch.bfloat16] and out.dtype == torch.bfloat16
    assert experts.w1.grad.dtype == torch.float32 and x.grad.dtype == torch.float32
