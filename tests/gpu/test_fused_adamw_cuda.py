"""On CUDA the optimizer is torch's fused AdamW, and its update equals the foreach one."""
from __future__ import annotations

import pytest
import torch

from tests.support.specs import cpu_spec
from training.optim import build_optimizer

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_cuda_parameters_get_fused_adamw_with_the_foreach_update():
    optim = cpu_spec("model=tiny").optim
    torch.manual_seed(0)
    models = [torch.nn.Linear(64, 64).cuda() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    fused = build_optimizer(models[0], optim=optim)
    assert fused.defaults["fused"] is True
    plain = torch.optim.AdamW(models[1].parameters(), lr=optim.lr, foreach=True,
                              betas=(optim.beta1, optim.beta2), eps=optim.eps,
                              weight_decay=optim.weight_decay)
    x = torch.randn(8, 64, device="cuda")
    for model, opt in zip(models, (fused, plain)):
        model(x).square().sum().backward()
        opt.step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
