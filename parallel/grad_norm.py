"""The global gradient norm over every kind of shard (DTensor placements, pipeline stages)."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def total_grad_norm(params: list[torch.Tensor], *, pp_group=None) -> torch.Tensor:
    """L2 norm of all gradients of the model: DTensor shards are reduced over their mesh;
    stages of a pipeline add their squared norms over `pp_group`."""
    squared = torch.zeros((), dtype=torch.float32)
    for grads in grads_by_mesh(params):  # plain tensors (replicated) and each mesh's shards apart
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        squared = squared.to(norm.device) + norm.float() ** 2
    norm = squared.sqrt()
    if pp_group is not None:
        dist.all_reduce(squared, group=pp_group)
        norm = squared.sqrt()
    return norm


def grads_by_mesh(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """The gradients in lists that one foreach op takes: plain tensors, and each mesh's
    DTensors, apart."""
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            key = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            by_mesh.setdefault(key, []).append(p.grad)
    return list(by_mesh.values())


def clip_grads(params: list[torch.Tensor], *, max_norm: float, pp_group=None,
               uncounted: tuple[torch.Tensor, ...] = ()) -> float:
    """Clip to `max_norm` (inf = only measure); return the norm before clipping. `uncounted`:
    parameters clipped but left out of the norm (a tied weight's second copy, whose gradient
    another pipeline rank counts, parallel/tied_embeddings.py)."""
    counted = [p for p in params if not any(p is u for u in uncounted)]
    norm = total_grad_norm(counted, pp_group=pp_group)
    total = float(norm)
    coefficient = min(max_norm / (total + 1e-6), 1.0)  # torch's clip_grad_norm_ formula
    if coefficient < 1.0:
        with torch.no_grad():
            for grads in grads_by_mesh(params):  # one op per list, not one per gradient
                torch._foreach_mul_(grads, coefficient)
    return total
