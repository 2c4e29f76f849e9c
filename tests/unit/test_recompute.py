"""Activation recompute: same numbers as no recompute, same names, and less saved memory.

Saved-activation bytes are measured as the storages created during forward that are still alive
when forward returns (everything backward will use). `saved_tensors_hooks` alone cannot see what
selective recompute keeps: checkpointing installs its own hooks inside each block, and the
selective policy caches op outputs outside autograd's saved tensors.
"""
from __future__ import annotations

import copy
import gc

import pytest
import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from tests.unit._specs import tiny_model_spec
from conf.schema import RecomputeMode
from conf.spec import RecomputeSpec
from parallel.recompute import apply_recompute
from training.accounting import activation_bytes, activation_elements_per_token_per_layer
from training.model import build_model

CPU = torch.device("cpu")
BATCH, SEQ = 4, 64
BYTES_FP32 = 4


class _NewStorages(TorchDispatchMode):
    """Records (weak reference, bytes) of every storage an op returns."""

    def __init__(self):
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                ref = StorageWeakRef(storage)
                self.storages.setdefault(ref.cdata, (ref, storage.nbytes()))
        return out


def _batch(vocab: int = 256) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (BATCH, SEQ + 1), generator=generator)


def _loss(model, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def _model(mode: RecomputeMode, **spec_overrides):
    model = build_model(tiny_model_spec(**spec_overrides), device=CPU, seed=0)
    apply_recompute(model, recompute=RecomputeSpec(mode=mode))
    return model


def saved_activation_bytes(model, batch: torch.Tensor) -> int:
    """Bytes of storages created in forward and still alive for backward (unique storages)."""
    existing = {StorageWeakRef(t.untyped_storage()).cdata
                for t in [*model.parameters(), *model.buffers(), batch]}
    recorder = _NewStorages()
    with recorder:
        loss = _loss(model, batch)
    gc.collect()
    alive = sum(nbytes for key, (ref, nbytes) in recorder.storages.items()
                if key not in existing and not ref.expired())
    loss.backward()  # keep `loss` (and so the graph) alive until after counting
    return alive


def _loss_and_grads(model, batch):
    loss = _loss(model, batch)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("mode", [RecomputeMode.full, RecomputeMode.selective])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_recompute_gives_same_loss_and_gradients(mode, tied):
    batch = _batch()
    reference = _model(RecomputeMode.none, tie_embeddings=tied)
    reference_loss, reference_grads = _loss_and_grads(reference, batch)
    loss, grads = _loss_and_grads(_model(mode, tie_embeddings=tied), batch)
    torch.testing.assert_close(loss, reference_loss, atol=1e-6, rtol=0)
    assert grads.keys() == reference_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, reference_grads[name], atol=1e-6, rtol=0, msg=name)


@pytest.mark.parametrize("mode", list(RecomputeMode))
def test_recompute_keeps_names(mode):
    reference = _model(RecomputeMode.none)
    model = _model(mode)
    assert list(model.state_dict()) == list(reference.state_dict())
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in reference.named_parameters()]
    assert [n for n, _ in model.named_modules()] == [n for n, _ in reference.named_modules()]
    model.load_state_dict(reference.state_dict())  # loads without any key translation


def test_mode_accepts_plain_strings_and_none_changes_nothing():
    model = _model(RecomputeMode.none)
    assert all(type(block).__name__ == "TransformerBlock" for block in model.layers)
    apply_recompute(model, recompute=RecomputeSpec(mode="selective"))
    assert all(type(block).__name__ == "RecomputeTransformerBlock" for block in model.layers)


def test_recomputed_model_survives_deepcopy():
    model = _model(RecomputeMode.selective)
    clone = copy.deepcopy(model)
    batch = _batch()
    torch.testing.assert_close(_loss(clone, batch), _loss(model, batch))
    _loss(clone, batch).backward()
    assert model.layers[0].attention.wq.weight.grad is None  # the copy owns its parameters


def test_saved_activation_bytes_order_full_selective_none():
    batch = _batch()
    saved = {mode: saved_activation_bytes(_model(mode), batch) for mode in RecomputeMode}
    print("saved activation bytes:", {mode.value: n for mode, n in saved.items()})
    assert saved[RecomputeMode.full] < saved[RecomputeMode.selective] < saved[RecomputeMode.none]


def test_saved_activation_bytes_match_the_plan_estimate():
    """The plan's activation formula (training/accounting.py) against what forward keeps:
    per block exactly (3 layers minus 2), and in total within the few bytes of scalars."""
    batch = _batch()
    tokens = BATCH * SEQ
    for mode in RecomputeMode:
        per_layer = activation_elements_per_token_per_layer(tiny_model_spec(), recompute=mode.value)
        two = saved_activation_bytes(_model(mode, n_layers=2), batch)
        three = saved_activation_bytes(_model(mode, n_layers=3), batch)
        assert three - two == per_layer * tokens * BYTES_FP32, mode
        estimate = activation_bytes(tiny_model_spec(n_layers=3), tokens=tokens,
                                    recompute=mode.value, dtype_bytes=BYTES_FP32)
        assert 0 <= three - estimate <= 64, (mode, three, estimate)
