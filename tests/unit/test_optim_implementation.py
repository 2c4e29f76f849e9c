"""AdamW's kernel choice: fused only when every parameter is on CUDA."""
from __future__ import annotations

import torch

from tests.support.specs import cpu_spec
from training.optim import build_optimizer, implementation


def test_cpu_and_meta_parameters_keep_torchs_default_kernel():
    assert implementation([torch.zeros(2), torch.zeros(2, 2)]) == {}
    assert implementation([torch.empty(2, device="meta")]) == {}
    assert implementation([]) == {}
    optimizer = build_optimizer(torch.nn.Linear(4, 4), optim=cpu_spec("model=tiny").optim)
    assert not optimizer.defaults["fused"]
