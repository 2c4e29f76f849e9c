"""What forward keeps for backward under each recompute policy, measured on one process: the
policies by name, the tiny model and batch they run on, and the bytes of storages created in
forward still alive when it returns (everything backward will use).

`saved_tensors_hooks` alone cannot see what selective recompute keeps: checkpointing installs its
own hooks inside each checkpointed region, and the ops policy caches op outputs outside
autograd's saved tensors; a dispatch mode sees every storage an op returns.
"""
from __future__ import annotations

import gc

import torch
import torch.nn.functional as F
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from conf.schema import OpsMatmuls, RecomputeMode
from conf.spec import RecomputeSpec
from parallel.recompute import apply_recompute
from tests.support.specs import tiny_model_spec
from training.model_builder import build_model

CPU = torch.device("cpu")
BATCH, SEQ = 4, 64
BYTES_FP32 = 4


def selective(*targets: str, every_n_layers: int = 1,
              ops_matmuls: OpsMatmuls = OpsMatmuls.all) -> RecomputeSpec:
    return RecomputeSpec(mode=RecomputeMode.selective, targets=targets,
                         every_n_layers=every_n_layers, ops_matmuls=ops_matmuls)


POLICIES = {
    "none": RecomputeSpec(mode=RecomputeMode.none),
    "full": RecomputeSpec(mode=RecomputeMode.full),
    "full_every2": RecomputeSpec(mode=RecomputeMode.full, every_n_layers=2),
    "ops": selective("ops"),
    "ops_attention": selective("ops", "attention"),
    "ops_alternate": selective("ops", ops_matmuls=OpsMatmuls.alternate),
    "ops_alternate_attention": selective("ops", "attention", ops_matmuls=OpsMatmuls.alternate),
    "swiglu": selective("swiglu"),
    "norm": selective("norm"),
    "attention": selective("attention"),
    "ffn": selective("ffn"),
    "block": selective("block"),
    "swiglu_norm_attention": selective("swiglu", "norm", "attention"),
    "swiglu_every2": selective("swiglu", every_n_layers=2),
    "offload": RecomputeSpec(mode=RecomputeMode.offload),
    "offload_every2": RecomputeSpec(mode=RecomputeMode.offload, every_n_layers=2),
}


class NewStorages(TorchDispatchMode):
    """Records (weak reference, bytes, device type) of every storage an op returns."""

    def __init__(self):
        super().__init__()
        self.storages: dict[int, tuple[StorageWeakRef, int, str]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                storage = leaf.untyped_storage()
                ref = StorageWeakRef(storage)
                self.storages.setdefault(ref.cdata, (ref, storage.nbytes(), leaf.device.type))
        return out


def token_batch(vocab: int = 256, device: torch.device = CPU) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (BATCH, SEQ + 1), generator=generator).to(device)


def next_token_loss(model, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())


def recompute_model(recompute: RecomputeSpec, *, device: torch.device = CPU, **spec_overrides):
    model = build_model(tiny_model_spec(**spec_overrides), device=device, seed=0)
    apply_recompute(model, recompute=recompute)
    return model


def saved_activation_bytes(model, batch: torch.Tensor, *, device_type: str = "cpu") -> int:
    """Bytes of storages on `device_type` created in forward and still alive for backward."""
    existing = {StorageWeakRef(t.untyped_storage()).cdata
                for t in [*model.parameters(), *model.buffers(), batch]}
    recorder = NewStorages()
    gc.freeze()  # the collection below then scans only objects this forward created: fast
    try:
        with recorder:
            loss = next_token_loss(model, batch)
        gc.collect()
    finally:
        gc.unfreeze()
    alive = sum(nbytes for key, (ref, nbytes, device) in recorder.storages.items()
                if key not in existing and not ref.expired() and device == device_type)
    loss.backward()  # keep `loss` (and so the graph) alive until after counting
    return alive
