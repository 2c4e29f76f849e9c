"""The routed experts of one MoE block as three 3-D weights, computed group by group.

`GroupedExperts.forward(x, counts)` takes the token copies sorted by expert (x [M, dim], the
first counts[0] rows for expert 0, the next counts[1] for expert 1, ...; sum(counts) <= M,
the rows past it belong to no expert) and returns each row through its expert's SwiGLU:
w2_e(silu(w1_e x) * w3_e x). It depends only on (x, counts) and its weights, so expert
parallelism can wrap it (all-to-all in, the local experts, all-to-all out).

The three matmuls are torch's grouped GEMM (`torch._grouped_mm`, offsets on the device: no
host sync) where torch has it for the compute dtype: bf16 (under autocast too: x and the
fp32 master weights are cast to the autocast dtype) on CUDA compute capability >= 9.0, or on
the CPU where a one-time probe finds torch's CPU kernel. Only bf16: torch's meta kernel, which
torch.compile and fake tensors trace with, refuses other dtypes. Elsewhere (fp32), or with
`allow_grouped_mm` off, one matmul per expert over its slice (the split sizes are read once
on the host; on CPU that costs nothing).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

GROUPED_MM_ALIGN_BYTES = 16
"""torch._grouped_mm needs every stride a multiple of 16 bytes (widths x element size)."""


class GroupedExperts(nn.Module):
    """num_experts SwiGLU experts: w1 [E, ffn, dim] (gate), w3 [E, ffn, dim] (up),
    w2 [E, dim, ffn] (down); Hugging Face's per-expert gate_proj / up_proj / down_proj."""

    def __init__(self, *, num_experts: int, dim: int, ffn_dim: int):
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, ffn_dim, dim))
        self.w3 = nn.Parameter(torch.empty(num_experts, ffn_dim, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, ffn_dim))
        self.allow_grouped_mm = True
        """False: always the per-expert loop (benchmarks/moe_vs_dense.py compares the two)."""

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x [M, dim] sorted by expert, counts [E] (int64, sum <= M) -> [M, dim]. The rows
        past sum(counts) are no expert's: their outputs and input gradients are unspecified
        (the grouped GEMM leaves them unwritten); the caller masks them."""
        dtype = compute_dtype(x)
        if self.allow_grouped_mm and use_grouped_mm(x, self.w1, dtype=dtype):
            weights = (w.to(dtype) for w in (self.w1, self.w2, self.w3))
            return _grouped(x.to(dtype), counts, *weights)
        return _looped(x, counts, self.w1, self.w2, self.w3)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the matmuls on `x` run in: autocast's where it is on for x's device."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return x.dtype


def use_grouped_mm(x: torch.Tensor, weight: torch.Tensor, *, dtype: torch.dtype) -> bool:
    """Grouped GEMM where torch has it for matmuls in `dtype` on x's device: CUDA (compute
    capability >= 9.0) or a CPU whose kernel the probe found, in bf16; every width 16-byte
    aligned."""
    if dtype != torch.bfloat16 or not hasattr(torch, "_grouped_mm"):
        return False
    if x.is_cuda:
        if torch.cuda.get_device_capability(x.device)[0] < 9:
            return False
    elif not (x.device.type == "cpu" and grouped_mm_on_cpu()):
        return False
    itemsize = torch.empty((), dtype=dtype).element_size()
    return all(size * itemsize % GROUPED_MM_ALIGN_BYTES == 0 for size in weight.shape[1:])


@torch.compiler.assume_constant_result
def grouped_mm_on_cpu() -> bool:
    """Whether this torch runs torch._grouped_mm on CPU in bf16, forward and backward, equal
    to the loop (probed once, on first use, with an empty and an uneven group, on real CPU tensors
    even when the first use is under a fake-tensor or meta mode; a constant to torch.compile,
    which would trace through a functools.cache wrapper)."""
    return _grouped_mm_on_cpu_once()


@functools.cache
def _grouped_mm_on_cpu_once() -> bool:
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes(), torch.device("cpu"):
        return _probe_grouped_mm_on_cpu()


def _probe_grouped_mm_on_cpu() -> bool:
    try:
        gen = torch.Generator().manual_seed(0)
        x = (torch.randn(12, 8, generator=gen) * 0.5).bfloat16().requires_grad_()
        w1, w2, w3 = ((torch.randn(3, 8, 8, generator=gen) * 0.3).bfloat16().requires_grad_()
                      for _ in "123")
        counts = torch.tensor([5, 0, 7])
        got = _grouped(x, counts, w1, w2, w3)
        (grad_got,) = torch.autograd.grad(got.square().sum(), [w2])
        want = _looped(x, counts, w1, w2, w3)
        (grad_want,) = torch.autograd.grad(want.square().sum(), [w2])
        return bool(torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2)
                    and torch.allclose(grad_got.float(), grad_want.float(), rtol=2e-2, atol=2e-2))
    except (RuntimeError, NotImplementedError):
        return False


def _grouped(x, counts, w1, w2, w3) -> torch.Tensor:
    offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
    gate = torch._grouped_mm(x, w1.transpose(-2, -1), offs=offsets)
    up = torch._grouped_mm(x, w3.transpose(-2, -1), offs=offsets)
    return torch._grouped_mm(F.silu(gate) * up, w2.transpose(-2, -1), offs=offsets)


def _looped(x, counts, w1, w2, w3) -> torch.Tensor:
    sizes = counts.tolist()  # this path's one host read: the slices' sizes
    *slices, rest = torch.split(x, [*sizes, x.shape[0] - sum(sizes)], dim=0)
    outputs = []  # unbind, not w[e]: one backward stack, not E zero-filled [E, ...] grads
    for rows, gate, up, down in zip(slices, w1.unbind(0), w3.unbind(0), w2.unbind(0)):
        outputs.append((F.silu(rows @ gate.t()) * (rows @ up.t())) @ down.t())
    outputs.append(rest.new_zeros(rest.shape, dtype=outputs[0].dtype))  # no expert's rows
    return torch.cat(outputs, dim=0)
