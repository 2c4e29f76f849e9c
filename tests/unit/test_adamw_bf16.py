"""AdamW with bf16 moments follows torch's AdamW up to bf16 rounding of the moments."""
from __future__ import annotations

import torch

from training.adamw_bf16 import AdamWBf16State


def test_bf16_moments_track_torch_adamw_and_halve_the_state():
    torch.manual_seed(0)
    weights = [torch.randn(64, 32), torch.randn(32)]
    ours = [w.clone().requires_grad_() for w in weights]
    theirs = [w.clone().requires_grad_() for w in weights]
    groups = lambda params: [{"params": [params[0]], "weight_decay": 0.1},  # noqa: E731
                             {"params": [params[1]], "weight_decay": 0.0}]
    kwargs = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    ours_opt = AdamWBf16State(groups(ours), **kwargs)
    theirs_opt = torch.optim.AdamW(groups(theirs), **kwargs)
    for step in range(5):
        grads = [torch.randn_like(w) for w in weights]
        for params, opt in ((ours, ours_opt), (theirs, theirs_opt)):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
    for a, b, start in zip(ours, theirs, weights):
        moved = (b.detach() - start).abs().max()
        assert (a - b).abs().max() <= 0.02 * moved  # bf16 keeps ~3 significant digits
    state = ours_opt.state[ours[0]]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    assert float(state["step"]) == 5
