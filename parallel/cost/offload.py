"""Activation offload's host traffic (`recompute.mode=offload` on a GPU). Torch-free.

What moves: every tensor a covered block saves for backward that is not a parameter
(parallel/recompute.py `_SaveActivationsOnCpu`): the activations `none` keeps and offload
does not keep on the device (parallel.cost.activations: on a GPU offload keeps nothing of a
covered block), plus autocast's compute-dtype weight copies of those blocks (plain tensors,
not parameters: parallel.cost.memory_static.autocast_keeps_copy). Per step that is one pass per
micro-batch (accumulation x pipeline micro-batches) through the rank's blocks, copied out to
host memory in forward and back in backward: 2 x those bytes over the host link (PCIe, or
NVLink-C2C on Grace superchips: parallel.cost.devices `host_link_gbps`).

Overlap rule: none. meshrun's pack hook copies into pinned host memory with a blocking
`copy_` (the host waits for each copy), and its unpack hook's `.to(device,
non_blocking=True)` runs on the compute stream, ordered with the kernels around it; torch's
own `save_on_cpu(pin_memory=True)` is the same but its pack copy is non-blocking - still on
the compute stream. Neither uses a side stream, so no copy runs under a matmul: the whole
transfer time is on the step's critical path. On a CPU device nothing moves (offload keeps
what none keeps there).
"""
from __future__ import annotations

from functools import lru_cache

from conf.schema import RecomputeMode
from conf.spec import ModelSpec, RecomputeSpec, RunSpec
from parallel.cost.activations import (ActivationSplit, activation_dtypes,
                                       block_bytes_per_micro_batch, block_bytes_per_token)
from parallel.cost.memory_static import autocast_keeps_copy
from parallel.cost.params import held_layers, numel, parameter_shapes, tp_local_shape
from training.models.family import block_index

NONE = RecomputeSpec(mode=RecomputeMode.none)


def offloads(spec: RunSpec) -> bool:
    """Does the run copy activations to host memory (offload on a GPU)?"""
    return spec.recompute.mode is RecomputeMode.offload and spec.training.device == "cuda"


def offload_bytes_per_pass(spec: RunSpec, pp_rank: int) -> int:
    """Bytes pipeline rank `pp_rank` copies to the host (and back) for one micro-batch
    through its blocks: what `none` keeps of each block offload covers (offload keeps none of
    it on a GPU: the difference of parallel.cost.activations.activation_bytes, block by
    block), plus the autocast weight copies of those blocks; 0 unless `offloads(spec)`."""
    if not offloads(spec):
        return 0
    p, t = spec.parallel, spec.training
    covered = tuple(layer for layer in held_layers(spec, pp_rank)
                    if spec.recompute.applies_to(layer))
    micro_batch = t.micro_batch_size // p.pp_microbatches
    tokens = p.cp_share(micro_batch * t.seq_len)
    dtypes = activation_dtypes(spec.precision, uses_fsdp=p.uses_fsdp)
    split = ActivationSplit.of(p, document_mask=spec.data.document_mask)
    per_block = tokens * block_bytes_per_token(spec.model, recompute=NONE, device_type="cuda",
                                               dtypes=dtypes, split=split) + \
        block_bytes_per_micro_batch(spec.model, recompute=NONE, seq=tokens // micro_batch,
                                    device_type="cuda", dtypes=dtypes, split=split,
                                    micro_batch=micro_batch)
    copies = 0 if p.uses_fsdp or not dtypes.autocast else dtypes.compute * _copied_elements(
        spec.model, spec.recompute, covered, p.tp)
    return int(len(covered) * per_block) + copies


@lru_cache(maxsize=256)
def _copied_elements(model: ModelSpec, recompute: RecomputeSpec, covered: tuple[int, ...],
                     tp: int) -> int:
    """Elements of the autocast weight copies of blocks `covered` on one tp rank: the ones
    none keeps (parallel.cost.memory.autocast_keeps_copy), all of which offload moves."""
    return sum(numel(tp_local_shape(name, shape, tp, model.family))
               for name, shape in parameter_shapes(model) if block_index(name) in covered
               and autocast_keeps_copy(name, shape, model, NONE, device_type="cuda"))


def offload_bytes_per_step(spec: RunSpec) -> int:
    """Bytes the busiest pipeline rank copies out to the host in a step (and as many back):
    one pass per micro-batch (module docstring)."""
    if not offloads(spec):
        return 0
    passes = spec.training.grad_accum_steps * spec.parallel.pp_microbatches
    return passes * max(offload_bytes_per_pass(spec, r) for r in range(spec.parallel.pp))


def offload_s(spec: RunSpec, *, host_gbps: float) -> float:
    """Seconds the step spends copying activations out and back (no overlap: module
    docstring)."""
    return 2 * offload_bytes_per_step(spec) / (host_gbps * 1e9) if offloads(spec) else 0.0
