"""On a CUDA machine: context parallelism's CUDA attention path (`attention_by_runs`: each run
of a rank's queries against the keys up to its end under torch's lower-right causal bias, the
flash kernel in bf16) equals full causal attention, forward and backward, for the positions a
load-balanced rank holds. One process: the whole sequence is this rank's, its runs in the
balanced order (chunk 0, chunk 3, then chunks 1-2), so the lower-right alignment, the key
ordering and the join are all exercised. Skipped without CUDA; run with
`.venv/bin/pytest tests/gpu`."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parallel.context_parallel import attention_by_runs, position_runs

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2e-2), (torch.float32, 2e-4)])
def test_attention_by_runs_equals_causal_attention(dtype, tol):
    torch.manual_seed(0)
    T, c = 1024, 256
    order = [*range(0, c), *range(3 * c, 4 * c), *range(c, 3 * c)]
    device = torch.device("cuda")
    q, k, v = (torch.randn(2, hq, T, 64, device=device, dtype=dtype, requires_grad=True)
               for hq in (8, 4, 4))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    weight = torch.randn_like(ref)
    ref_grads = torch.autograd.grad((ref * weight).sum(), (q, k, v))
    index = torch.tensor(order, device=device)
    local = [t.detach().index_select(2, index).requires_grad_() for t in (q, k, v)]
    out = attention_by_runs(*local, k_positions=index, runs=position_runs(order))
    assert len(position_runs(order)) == 3
    grads = torch.autograd.grad((out * weight.index_select(2, index)).sum(), local)
    torch.testing.assert_close(out, ref.index_select(2, index), atol=tol, rtol=tol)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want.index_select(2, index), atol=tol * 5, rtol=tol * 5)
