"""optim=muon: Muon for the 2-D weights inside the blocks, AdamW for everything else, as one
optimizer per model part (one state, one list of param groups: the checkpoint, the LR
schedule and the loss scaler see a single optimizer).

Muon's math is torch.optim.Muon's (its constructor, its Newton-Schulz orthogonalisation in
bf16 and its lr adjustment `adjust_lr_fn`); only the step is this file's, because under
every layout the orthogonalisation needs each whole matrix while FSDP (Shard(0) on the
dp_shard axis) and tp (Shard(0) or Shard(1) on the tp axis) hold DTensor shards: the
momentum is updated on the local shard (elementwise, exact), the update is all-gathered
whole (`full_tensor`), orthogonalised on every rank (the same input gives the same result
everywhere), and each rank takes its own shard back (a local slice, no communication).
Plain tensors (one process, DDP, ZeRO-1's owned parameters, pipeline stages) skip the
gather. Memory and time in the plan: parallel/cost/optimizer_state.py.
"""
from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate
from torch.optim._muon import _adjust_lr, _zeropower_via_newtonschulz


class GatheringMuon(torch.optim.Muon):
    """torch.optim.Muon whose parameters may be DTensor shards (module docstring)."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update(param, group)
        return None

    def _update(self, param: torch.Tensor, group: dict) -> None:
        state = self.state[param]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(param.grad)
        grad, buf, weight = (_local(t) for t in (param.grad, state["momentum_buffer"], param))
        momentum = group["momentum"]
        buf.lerp_(grad, 1 - momentum)
        update = grad.lerp(buf, momentum) if group["nesterov"] else buf
        update = orthogonalised_shard(update, like=param, group=group)
        lr = group["lr"]
        weight.mul_(1 - lr * group["weight_decay"])
        weight.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], param.shape))


def orthogonalised_shard(update: torch.Tensor, *, like: torch.Tensor, group: dict
                         ) -> torch.Tensor:
    """This rank's shard of the orthogonalised whole matrix whose local shard is `update`
    (laid out as parameter `like`)."""
    whole = update
    if isinstance(like, DTensor):
        whole = DTensor.from_local(update, like.device_mesh, like.placements, run_check=False,
                                   shape=like.shape, stride=like.stride()).full_tensor()
    ortho = _zeropower_via_newtonschulz(whole, group["ns_coefficients"], group["ns_steps"],
                                        group["eps"])
    if not isinstance(like, DTensor):
        return ortho
    replicated = DTensor.from_local(ortho, like.device_mesh,
                                    [Replicate()] * like.device_mesh.ndim, run_check=False)
    return replicated.redistribute(like.device_mesh, like.placements).to_local()


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class MuonWithAdamW(torch.optim.Optimizer):
    """`muon` and `adamw` (built over disjoint parameters) stepped as one optimizer: its
    param_groups are theirs (Muon's first), its state is shared by both."""

    def __init__(self, muon: torch.optim.Optimizer, adamw: torch.optim.Optimizer):
        self.muon, self.adamw = muon, adamw
        super().__init__(muon.param_groups + adamw.param_groups, defaults={})
        self._link()

    def _link(self) -> None:
        """Point both optimizers at this one's groups and state (again after a load, which
        replaces both)."""
        split = len(self.muon.param_groups)
        self.muon.param_groups = self.param_groups[:split]
        self.adamw.param_groups = self.param_groups[split:]
        self.muon.state = self.adamw.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        self.muon.step()
        self.adamw.step()
        return None

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self._link()
