"""AdamW with weight decay only on weights with 2 or more dims, or Muon with AdamW
(optim=muon); one optimizer per model part."""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from conf.schema import DType
from conf.spec import OptimSpec
from parallel.cost.optimizer_state import muon_matrix, uses_muon
from parallel.data_parallel import unwrap


def param_groups(params: list[torch.Tensor], weight_decay: float) -> list[dict]:
    decay, no_decay = [], []
    for param in params:
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def implementation(params: list[torch.Tensor]) -> dict:
    """AdamW's kernel choice: fused (one kernel for all tensors; torchtitan's default) when
    every parameter is on CUDA; elsewhere foreach (one op per step of the update for all
    tensors, bit-identical to torch's per-tensor loop on CPU, so CPU losses stay equal to the
    single-process references) where every parameter is a plain tensor or every one a DTensor
    of one mesh (FSDP's shards: the per-tensor loop pays DTensor's dispatch about ten times per
    parameter); torch's default otherwise (a mix that foreach cannot take as one list). The
    memory plan restates this rule torch-free (parallel/cost/step_memory_terms.py adamw_foreach):
    change both together."""
    if not params or any(p.device.type == "meta" for p in params):
        return {}
    if all(p.device.type == "cuda" for p in params):
        return {"fused": True}
    meshes = {p.device_mesh if isinstance(p, DTensor) else None for p in params}
    return {"foreach": True} if len(meshes) == 1 else {}


def build_optimizer(model: torch.nn.Module, *, optim: OptimSpec, state_dtype: DType = DType.fp32,
                    owned: set | None = None) -> torch.optim.Optimizer:
    """The run's optimizer over `model`'s parameters (only those in `owned` under ZeRO-1):
    AdamW, or with optim=muon Muon over the matrices `muon_matrix` names and AdamW over
    the rest (training/muon.py)."""
    named = [(n, p) for n, p in unwrap(model).named_parameters()
             if owned is None or p in owned]
    if not uses_muon(optim):
        return build_adamw([p for _, p in named], optim=optim, state_dtype=state_dtype)
    matrices = [p for n, p in named if p.requires_grad and muon_matrix(n, tuple(p.shape))]
    rest = [p for _, p in named if id(p) not in {id(m) for m in matrices}]
    if not matrices:
        return build_adamw(rest, optim=optim, state_dtype=state_dtype)
    from training.muon import GatheringMuon, MuonWithAdamW

    muon = GatheringMuon(matrices, lr=optim.lr, weight_decay=optim.weight_decay,
                         momentum=optim.momentum, nesterov=optim.nesterov,
                         ns_steps=optim.ns_steps, adjust_lr_fn=optim.muon_lr_scale.value)
    if not any(p.requires_grad for p in rest):
        return muon
    return MuonWithAdamW(muon, build_adamw(rest, optim=optim, state_dtype=state_dtype))


def build_adamw(params: list[torch.Tensor], *, optim: OptimSpec, state_dtype: DType
                ) -> torch.optim.Optimizer:
    """AdamW over `params`, weight decay on the matrices only (`param_groups`)."""
    kwargs = dict(lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps)
    if state_dtype == DType.bf16:
        from training.adamw_bf16 import AdamWBf16State

        return AdamWBf16State(param_groups(params, optim.weight_decay), **kwargs)
    return torch.optim.AdamW(param_groups(params, optim.weight_decay), **kwargs,
                             **implementation(params))


def build_optimizers(model, *, optim: OptimSpec, state_dtype: DType) -> list:
    """One optimizer per model part (pipeline stages), each over what this rank updates."""
    owned = model.zero1.owned() if model.zero1 is not None else None
    return [build_optimizer(part, optim=optim, state_dtype=state_dtype, owned=owned)
            for part in model.parts]


def set_lr(optimizers: list, lr: float) -> None:
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr
