"""ZeRO-2/3 and HSDP with FSDP2 (`fully_shard`) over the dp_shard x cp ranks.

zero=3 re-shards parameters after forward (all-gathered again for backward); zero=2 keeps
them gathered from forward to backward (no second all-gather, more memory); both shard
gradients (reduce-scatter) and optimizer state. With dp_replicate > 1 the mesh is 2-D
(replicate, shard): HSDP, shards within a group and all-reduce across the groups.

The units, as torchtitan draws them (one all-gather and one reduce-scatter each), named by the
model family (`FsdpUnits`, training/models/):
- the `resharded` edge modules (Llama: the token embedding), each alone, re-sharded after
  forward like the blocks (zero=3): not needed again until the very end of backward;
- each block;
- the `gathered` unit (Llama: the final norm with the head; tied embeddings: the embedding and
  final norm, one shared weight), never re-sharded after forward: backward starts with them,
  so a re-shard would be gathered again at once; their gradients are reduce-scattered as soon
  as the head's backward ends, overlapping the blocks' backward (in one root unit with the
  embedding they would wait for the embedding's backward, the last thing to run);
- the root (the model or pipeline stage) with whatever is left (no parameters in Llama).
A pipeline stage holds only its own parts (the embedding on the first, norm and head on the
last); the units that are absent are skipped.
"""
from __future__ import annotations

import dataclasses

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.models import family_of
from training.models.family import BLOCKS


def apply_fsdp(model: nn.Module, *, mesh: DeviceMesh, zero: int,
               mp_policy: MixedPrecisionPolicy, experts: ExpertUnits | None = None) -> None:
    """Shard `model` (a model or one pipeline stage) in place; compute and reduce in the
    dtypes of `mp_policy` (training/precision.py builds it from the precision section).

    Forward inputs are not cast at each unit (cast_forward_inputs=False, as torchtitan): the
    blocks' activations are already in the compute dtype (the gathered embedding's), and a
    cast would only copy the fp32 RoPE tables passed to every block, which the attention
    casts where it uses them (the same rounding either way)."""
    reshard = zero == 3
    mp_policy = dataclasses.replace(mp_policy, cast_forward_inputs=False)

    def shard(modules, *, reshard_after_forward: bool) -> None:
        fully_shard(modules, mesh=mesh, mp_policy=mp_policy,
                    reshard_after_forward=reshard_after_forward)

    if experts is not None:
        shard_experts_units(model, experts, mp_policy=mp_policy, reshard=reshard)
    resharded, gathered = _edge_units(model)
    for module in resharded:
        shard(module, reshard_after_forward=reshard)
    for block in getattr(model, BLOCKS).values():
        shard(block, reshard_after_forward=reshard)
    if gathered:
        shard(gathered, reshard_after_forward=False)
    shard(model, reshard_after_forward=reshard)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExpertUnits:
    """Expert parallelism's FSDP units: each block's experts module (`path`, ep-sharded
    DTensors) sharded alone over `mesh` (the efsdp axis: the ranks holding the same experts),
    before its block; their gradients are averaged over all `divide_by` (dp x cp) ranks, as
    every other gradient is, though they are reduced over fewer ranks (torchtitan's rule)."""

    mesh: DeviceMesh
    path: str
    divide_by: int


def shard_experts_units(model: nn.Module, experts: ExpertUnits, *,
                        mp_policy: MixedPrecisionPolicy, reshard: bool) -> None:
    from parallel.expert_parallel import experts_modules

    flattened = False
    for module in experts_modules(model, path=experts.path):
        fully_shard(module, mesh=experts.mesh, mp_policy=mp_policy,
                    reshard_after_forward=reshard)
        mesh = next(module.parameters()).device_mesh  # (efsdp, ep), FSDP's 2-D mesh
        if not flattened and mesh.ndim > 1:  # one all-reduce for the gradient norm, not two
            mesh._flatten(mesh_dim_name="efsdp_ep")
            flattened = True
        module.set_gradient_divide_factor(float(experts.divide_by))
        if experts.mesh.size() > 1:  # a plain sum, then the division (gloo has no PREMUL_SUM);
            module.set_force_sum_reduction_for_comms(True)  # alone, torch 2.13 divides twice


def _edge_units(model: nn.Module) -> tuple[list[nn.Module], list[nn.Module]]:
    """(the edge modules sharded alone, the modules of the never-resharded unit) this model or
    stage holds."""
    units = family_of(model.spec).fsdp_units(tied=model.spec.tie_embeddings)

    def held(names: tuple[str, ...]) -> list[nn.Module]:
        return [m for m in (getattr(model, name, None) for name in names) if m is not None]

    return held(units.resharded), held(units.gathered)
