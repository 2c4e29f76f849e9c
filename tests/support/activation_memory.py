"""Rank-side code of tests/distributed/test_activation_memory.py: what one forward under a
layout keeps for backward on this rank, and the peak of the whole step (peak_memory.py),
against the plan (parallel.cost.memory).

Measured as tests/unit/test_recompute.py does, per rank: the storages created during forward
(a TorchDispatchMode sees every op; a DTensor counts its local shard) that are still alive when
forward returns, unique, minus the weights: parameters (sharded, or gathered by FSDP and
still held), autocast's casts of parameters and of their views (an expert's slice of the
stacked expert weights: the plan's weight copies) and storages FSDP has
already freed (resized to 0). Saved-tensor hooks alone miss what checkpointed regions keep
(their own hooks, the ops policy's cache), so they are not the measure here.

Mixture-of-experts blocks: what a rank's experts keep depends on how many token copies the
router sent them; the plan takes a balanced load (parallel/cost/expert_activations.py), so
each row's plan is moved by expert_bytes_per_copy x (copies received - copies sent) per MoE
block, the copies counted from the routers' loads of this forward (`routed_copies`).
"""
from __future__ import annotations

import contextlib
import gc
import os
import time

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from conf.spec import RunSpec
from conf.run_dir.spec_io import spec_from_dict
from tests.support.peak_memory import LiveBytes, state_tensors, warm_optimizers

CPU = torch.device("cpu")
PEAK_SLACK = 0.01
"""The step's peak is summed once each 1% of it is newly made (peak_memory.LiveBytes)."""
PEAK_TOLERANCE = 0.10
"""The step's peak is the plan's within 10% (tests/distributed/test_activation_memory.py)."""
PEAK_TRIES = 3
"""A peak off the plan by more than PEAK_TOLERANCE is measured again, over as many steps, and
the least kept: gloo's worker thread drops its reference to a finished collective's buffers
a moment after the op returns (`_settled`), and on a loaded machine that moment can come
some ops later, so a step can see, say, FSDP's flat all-gather output (a whole unit) alive
after the copy-out freed it (CI saw pp2_dp2 rank 2 at 1.108 once, at 1.062 ever since).
Late frees only add bytes, so the least of the tries is the step's peak in program order; a
plan that is wrong is wrong on every try."""
DEBUG = os.environ.get("MESHRUN_DEBUG_ACTIVATIONS")
"""Set to print every kept storage (bytes, the op that made it, shape, dtype) on rank 0."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def _key(tensor: torch.Tensor) -> int:
    return StorageWeakRef(_local(tensor).untyped_storage()).cdata


class _Storages(TorchDispatchMode):
    """Every storage an op returns (weak), and which are casts of parameters."""

    def __init__(self):
        super().__init__()
        self.refs: dict[int, StorageWeakRef] = {}
        self.weight_casts: set[int] = set()
        self.info = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                ref = StorageWeakRef(_local(leaf).untyped_storage())
                self.refs.setdefault(ref.cdata, ref)
                if DEBUG:
                    self.info.setdefault(ref.cdata, (str(func), tuple(leaf.shape), leaf.dtype))
                if (func is torch.ops.aten._to_copy.default
                        and _of_parameter(args[0])):
                    self.weight_casts.add(ref.cdata)
        return out


def _of_parameter(tensor) -> bool:
    """A parameter, or a view of one (an expert's slice of the stacked expert weights)."""
    return isinstance(tensor, nn.Parameter) or isinstance(getattr(tensor, "_base", None),
                                                           nn.Parameter)


def _live_bytes(ref: StorageWeakRef) -> int:
    if ref.expired():
        return 0
    return torch.UntypedStorage._new_with_weak_ptr(ref.cdata).nbytes()


def _settled(count, *, reads: int = 3, pause_s: float = 0.02, tries: int = 50) -> int:
    """`count()` once it stops changing: gloo releases a finished collective's buffers (the
    gathered logits, say) from its own thread a moment after the op returns, and storages
    are only freed, never made, between reads."""
    last, same = count(), 1
    for _ in range(tries):
        if same == reads:
            break
        time.sleep(pause_s)
        value = count()
        same = same + 1 if value == last else 1
        last = value
    return last


def _weights(layout) -> set[int]:
    return {_key(t) for part in layout.parts for t in [*part.parameters(), *part.buffers()]}


def kept_bytes(layout, spec: RunSpec, inputs: torch.Tensor, targets: torch.Tensor,
               optimizers: list, documents: dict | None = None,
               routed: dict | None = None) -> int:
    """Activation bytes one forward of this rank's micro-batch keeps (module docstring);
    `documents`: the document-masking keywords (inputs, like the tokens: not counted);
    `routed` (if given) receives `routed_copies` of that forward."""
    from training.precision import autocast_context
    from training.step import clip_and_step, loss_context, token_loss_sum

    documents = documents or {}
    loads = _moe_loads(layout)
    before = _weights(layout) | {_key(t) for t in (inputs, targets, *documents.values())}
    if layout.cp_positions is not None:
        before.add(_key(layout.cp_positions))
    recorder = _Storages()
    gc.collect()  # the previous layout's garbage (fast: see frozen_imports)
    with recorder, loss_context(layout):
        loss = token_loss_sum(layout.parts[0], inputs, targets,
                              autocast_context(spec.precision, CPU), documents,
                              loss_chunks=layout.loss_chunks)
    if routed is not None:
        routed.update(routed_copies(layout, loads))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()  # no collective still running, holding a buffer
    gc.collect()
    excluded = before | _weights(layout) | recorder.weight_casts
    if DEBUG and torch.distributed.get_rank() == 0:
        for key, ref in recorder.refs.items():
            if key not in excluded and _live_bytes(ref):
                print(_live_bytes(ref), recorder.info.get(key), flush=True)
    kept = _settled(lambda: sum(_live_bytes(ref) for key, ref in recorder.refs.items()
                                if key not in excluded))
    with loss_context(layout):
        loss.backward()
    clip_and_step(layout, optimizers, grad_clip=spec.optim.grad_clip)
    return kept


def _moe_loads(layout) -> dict[int, tuple]:
    """{block: (its MoE module, the copies its router has counted so far per expert)}."""
    moes = {}
    for part in layout.parts:
        layers = getattr(part, "moe_layers", None)
        moes.update(layers() if layers is not None else {})
    return {index: (moe, moe.load_since_read.clone()) for index, moe in moes.items()}


def routed_copies(layout, loads: dict[int, tuple]) -> dict[int, tuple[int, int]]:
    """{MoE block: (token copies this rank's router sent since `loads`, copies this rank's
    experts received)}: without ep every copy stays; under ep the senders' loads summed over
    the ep ranks, this rank's experts' share (parallel/expert_parallel.py: Shard(0))."""
    out = {}
    for index, (moe, before) in loads.items():
        load = moe.load_since_read - before
        weight = moe.experts.w1
        names = weight.device_mesh.mesh_dim_names or () if isinstance(weight, DTensor) else ()
        if "ep" not in names:
            out[index] = (int(load.sum()), int(load.sum()))
            continue
        ep_mesh = weight.device_mesh["ep"]
        summed = load.clone()
        torch.distributed.all_reduce(summed, group=ep_mesh.get_group())
        local = summed.numel() // ep_mesh.size()
        start = ep_mesh.get_local_rank() * local
        out[index] = (int(load.sum()), int(summed[start:start + local].sum()))
    return out


def routing_difference(spec: RunSpec, routed: dict[int, tuple[int, int]]) -> int:
    """Bytes this rank's experts keep beyond the plan's balanced load (module docstring)."""
    from parallel.cost.activations import activation_dtypes, selective_targets
    from parallel.cost.expert_activations import expert_bytes_per_copy
    from conf.schema import RecomputeMode
    from conf.spec import RecomputeSpec

    dtypes = activation_dtypes(spec.precision, uses_fsdp=spec.parallel.uses_fsdp)
    total = 0
    for index, (sent, received) in routed.items():
        policy = (spec.recompute if spec.recompute.applies_to(index)
                  else RecomputeSpec(mode=RecomputeMode.none))
        per_copy = expert_bytes_per_copy(spec.model, recompute=policy, dtypes=dtypes,
                                         targets=selective_targets(policy), ep=spec.parallel.ep)
        total += int(per_copy * (received - sent))
    return total


def activation_rank(*, rank: int, world_size: int, spec_dicts: list[dict]) -> list[dict]:
    """For each spec, this rank's activation bytes kept after forward (measured, plan) and
    its peak over one whole step (peak_memory.LiveBytes: zero_grad'ed gradients, forward,
    backward, clip, AdamW over state made beforehand, as in any step after the first)
    against the plan's (estimate_memory(...).total)."""
    import training.parallel_model  # noqa: F401  (loads torch._dynamo) before the freeze
    import tests.support.pipeline_memory  # noqa: F401

    with frozen_imports():
        return [_spec_row(spec_from_dict(RunSpec, spec_dict), rank) for spec_dict in spec_dicts]


@contextlib.contextmanager
def frozen_imports():
    """Everything alive now (torch, Dynamo and the other imports: ~300k objects) moved to the
    permanent generation while the measurements run, so each gc.collect() (before and after
    every forward, at every pipeline reading) scans only the objects made since: milliseconds
    instead of ~0.5 s each here. Nothing frozen is garbage: it was collected just before."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _spec_row(spec: RunSpec, rank: int) -> dict:
    """activation_rank's row for one spec."""
    from parallel.cost.memory import estimate_memory, layout_activation_bytes
    from training.optim import build_optimizers
    from training.data.build import build_train_batches
    from training.parallel_model import build_parallel_model
    from training.step import document_inputs
    from tests.support.pipeline_memory import pipeline_rows

    layout = build_parallel_model(spec, rank=rank, device=CPU)
    batches = build_train_batches(spec.data, spec.training, dp_rank=layout.dims.dp_rank(rank),
                                  dp_size=layout.dims.dp).next_step()
    documents = document_inputs(layout, batches[0][0])  # {} unless data.document_mask
    inputs, targets = (layout.shard_tokens(t) for t in batches[0])
    optimizers = build_optimizers(layout, optim=spec.optim,
                                  state_dtype=spec.precision.optimizer_state_dtype)
    if layout.schedule is not None:
        return pipeline_rows(layout, spec, batches, optimizers, rank=rank, slack=PEAK_SLACK)
    warm_optimizers(layout, optimizers)
    routings: list[dict] = []  # each step's routed copies; the first step's is the row's

    def step() -> tuple[int, LiveBytes]:
        routings.append({})
        with LiveBytes([*state_tensors(layout, optimizers), inputs, targets,
                        *documents.values()], slack=PEAK_SLACK) as live:
            kept = kept_bytes(layout, spec, inputs, targets, optimizers, documents,
                              routings[-1])
        return kept, live

    plan_peak = estimate_memory(spec, rank=rank).total
    measured, live = least_peak(step, plan_peak)
    routed = routings[0]
    return {"name": spec.parallel.name, "rank": rank, "measured": measured,
            "loss_chunks": spec.training.loss_chunks, "routed": routed,
            "plan": layout_activation_bytes(spec, rank) + routing_difference(spec, routed),
            "peak": live.peak, "peak_at": live.peak_at, "plan_peak": plan_peak}


def least_peak(step, plan_peak: int) -> tuple[int, LiveBytes]:
    """(the first step's kept reading, the LiveBytes of the step with the least peak) of
    `step()` run until its peak is within PEAK_TOLERANCE of `plan_peak`, PEAK_TRIES at most
    (PEAK_TRIES says why)."""
    kept, least = step()
    for _ in range(PEAK_TRIES - 1):
        if abs(least.peak / plan_peak - 1) <= PEAK_TOLERANCE:
            break
        _, live = step()
        least = min(least, live, key=lambda measured: measured.peak)
    return kept, least
