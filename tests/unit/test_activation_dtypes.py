"""The plan's activation bytes by dtype regime (parallel/cost/activations.py) against what
forward really keeps on one process: fp32, autocast bf16 over fp32 weights (ddp, zero1, tp,
pp layouts) and bf16 parameters under autocast (what FSDP mixed precision gathers), for every
recompute policy. Exactly: per block (3 layers minus 2) and in total (plus the loss's two fp32
scalars).

Measured as tests/unit/test_recompute.py does (storages created in forward and alive after
it; tests/support/recompute_storages.py), with the trainer's loss (training/loss.py:
`logits.float()` then cross entropy) and the autocast weight casts counted apart: they are the
plan's weight copies (memory.py)."""
from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from parallel.cost.activations import ActivationDtypes, activation_bytes
from parallel.cost.memory_static import autocast_copied_weights
from tests.support.recompute_storages import (BATCH, POLICIES, SEQ, NewStorages, recompute_model,
                                              token_batch)
from tests.support.specs import tiny_model_spec
from training.loss import token_cross_entropy_sum

REGIMES = {
    "fp32": ActivationDtypes.uniform(4),
    "autocast_bf16": ActivationDtypes(residual=4, compute=2, autocast=True),
    "bf16_params": ActivationDtypes(residual=2, compute=2, autocast=False),  # FSDP mp, less
    # its cast of block inputs (measured with FSDP itself in tests/distributed)
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class _Casts(NewStorages):
    """Also records which new storages are casts of parameters (autocast's weight copies)."""

    def __init__(self):
        super().__init__()
        self.weight_casts: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func is torch.ops.aten._to_copy.default and isinstance(args[0], nn.Parameter):
            self.weight_casts.add(StorageWeakRef(out.untyped_storage()).cdata)
        return out


def measure(model, batch: torch.Tensor, regime: str) -> tuple[int, int]:
    """(activation bytes, weight-copy bytes) alive after forward."""
    if regime == "bf16_params":
        for p in model.parameters():
            p.data = p.data.bfloat16()
    inputs, targets = batch[:, :-1], batch[:, 1:].contiguous()  # the trainer's are contiguous
    existing = {StorageWeakRef(t.untyped_storage()).cdata
                for t in [*model.parameters(), *model.buffers(), batch, targets]}
    recorder = _Casts()
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=regime != "fp32")
    gc.freeze()
    try:
        with recorder:
            with autocast:
                logits = model(inputs)
            loss = token_cross_entropy_sum(logits, targets)
            del logits
        gc.collect()
    finally:
        gc.unfreeze()
    alive = {key: nbytes for key, (ref, nbytes, _) in recorder.storages.items()
             if key not in existing and not ref.expired()}
    copies = sum(n for key, n in alive.items() if key in recorder.weight_casts)
    loss.backward()
    return sum(alive.values()) - copies, copies


def _check(policy: str, regime: str) -> None:
    recompute, dtypes, tokens = POLICIES[policy], REGIMES[regime], BATCH * SEQ
    batch = token_batch()
    measured = {n: measure(recompute_model(recompute, n_layers=n), batch, regime) for n in (2, 3)}
    for n, (activations, copies) in measured.items():
        model = tiny_model_spec(n_layers=n)
        plan = activation_bytes(model, tokens=tokens, micro_batch=BATCH, recompute=recompute,
                                device_type="cpu", dtypes=dtypes)
        assert activations - plan == 8, (policy, regime, n, activations, plan)
        plan_copies = (2 * sum(autocast_copied_weights(model, recompute, device_type="cpu"))
                       if dtypes.autocast else 0)
        assert copies == plan_copies, (policy, regime, n, copies, plan_copies)
    if recompute.applies_to(2):
        per_block = measured[3][0] - measured[2][0]
        plan_block = (activation_bytes(tiny_model_spec(n_layers=3), tokens=tokens,
                                       micro_batch=BATCH, recompute=recompute,
                                       device_type="cpu", dtypes=dtypes, with_head=False)
                      - activation_bytes(tiny_model_spec(n_layers=2), tokens=tokens,
                                         micro_batch=BATCH, recompute=recompute,
                                         device_type="cpu", dtypes=dtypes, with_head=False))
        assert per_block == plan_block, (policy, regime, per_block, plan_block)


@pytest.mark.parametrize("regime", ["autocast_bf16", "bf16_params", "fp32"])
def test_activation_bytes_by_dtype_match_what_forward_keeps(regime):
    """Every policy; mutations tried: autocast's per-matmul copies counted once (3/2 -> 1),
    the fp32 upcast counted at the residual dtype, the RoPE table copies dropped: each fails."""
    for policy in POLICIES:
        _check(policy, regime)
