"""Rank-side code of the layout parity tests: one update under a layout against one process.

For each spec: a single-process reference model takes one AdamW step on the whole global batch;
then this rank builds its share under the spec's layout (training.parallel_model.build_parallel_model), takes
the same step on its share of the data, and compares the loss, every gradient and every
parameter after the step, gathered to full tensors and matched by parameter name.
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from conf.spec import RunSpec
from conf.run_dir.spec_io import spec_from_dict

ATOL, RTOL = 5e-6, 1e-4
CPU = torch.device("cpu")


def reference_batches(spec: RunSpec):
    """The whole global batch as one micro-batch of one process."""
    from training.data.build import build_train_batches

    t = dataclasses.replace(spec.training, micro_batch_size=spec.training.global_batch_size,
                            grad_accum_steps=1)
    return build_train_batches(spec.data, t, dp_rank=0, dp_size=1).next_step()


def local_bytes(tensors) -> int:
    """Bytes this rank holds for `tensors` (a DTensor's local shard only)."""
    total = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t = t.to_local() if isinstance(t, DTensor) else t
            total += t.numel() * t.element_size()
    return total


def held_bytes(layout, optimizers, *, grads_bytes: int) -> dict[str, int]:
    params = [p for p in named_params(layout).values()]
    optimizer = sum(local_bytes(state.values()) for o in optimizers for state in o.state.values())
    return {"params": local_bytes(params), "grads": grads_bytes, "optimizer": optimizer}


def full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def named_params(layout) -> dict[str, torch.Tensor]:
    from parallel.data_parallel import unwrap

    return {name: p for part in layout.parts for name, p in unwrap(part).named_parameters()}


def layout_micro_batches(spec: RunSpec) -> list:
    """The global batch as the layout's forwards take it: every dp rank's micro-batches, each
    cut into the pipeline's micro-batches as torch's schedule cuts it (tensor_split, dim 0).
    A loss that is not a sum over tokens (the MoE balancing loss) is per forward."""
    from training.data.build import build_train_batches

    dp = spec.parallel.dp
    pieces = spec.parallel.pp_microbatches if spec.parallel.pp > 1 else 1
    return [(inputs_part, targets_part)
            for rank in range(dp)
            for inputs, targets in build_train_batches(spec.data, spec.training, dp_rank=rank,
                                                       dp_size=dp).next_step()
            for inputs_part, targets_part in zip(torch.tensor_split(inputs, pieces),
                                                 torch.tensor_split(targets, pieces))]


def reference_update(spec: RunSpec, *, micro_batched: bool = False):
    """Loss (mean over the global batch), grads and params after one step, in one process
    (from the run's Hugging Face weights when it starts from some): the global batch as one
    micro-batch, or `micro_batched` as the layout's forwards take it (`layout_micro_batches`)."""
    from training.data.build import build_train_batches
    from training.hf_import import hf_start_dir
    from training.parallel_model import ParallelModel
    from training.model_builder import build_model
    from training.optim import build_optimizer
    from training.step import clip_and_step, forward_backward

    t = dataclasses.replace(spec.training, micro_batch_size=spec.training.global_batch_size,
                            grad_accum_steps=1)
    batches = (layout_micro_batches(spec) if micro_batched else
               build_train_batches(spec.data, t, dp_rank=0, dp_size=1).next_step())
    model = build_model(spec.model, device=CPU, seed=spec.training.seed,
                        hf_dir=hf_start_dir(spec))
    layout = ParallelModel.single(model)
    optimizer = build_optimizer(model, optim=spec.optim,
                                state_dtype=spec.precision.optimizer_state_dtype)
    loss = forward_backward(layout, batches, device=CPU, autocast=torch.autocast("cpu", enabled=False))
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    clip_and_step(layout, [optimizer], grad_clip=spec.optim.grad_clip)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return float(loss.local_loss_sum) / loss.global_tokens, grads, params


def layout_update(spec: RunSpec, rank: int):
    from training.data.build import build_train_batches
    from training.parallel_model import build_parallel_model
    from training.optim import build_optimizers
    from training.step import clip_and_step, forward_backward

    layout = build_parallel_model(spec, rank=rank, device=CPU)
    check_groups(layout)
    optimizers = build_optimizers(layout, optim=spec.optim,
                                  state_dtype=spec.precision.optimizer_state_dtype)
    batches = build_train_batches(spec.data, spec.training, dp_rank=layout.dims.dp_rank(rank),
                                  dp_size=layout.dims.dp).next_step()
    loss = forward_backward(layout, batches, device=CPU,
                            autocast=torch.autocast("cpu", enabled=False))
    own = torch.tensor([float(loss.local_loss_sum) if layout.reports_loss else 0.0],
                       dtype=torch.float64)
    dist.all_reduce(own)
    grads = {n: full(p.grad) for n, p in named_params(layout).items()}
    grads_bytes = local_bytes(p.grad for p in named_params(layout).values())
    clip_and_step(layout, optimizers, grad_clip=spec.optim.grad_clip)
    params = {n: full(p) for n, p in named_params(layout).items()}
    memory = held_bytes(layout, optimizers, grads_bytes=grads_bytes)
    return own.item() / loss.global_tokens, grads, params, memory


def assert_same_update(where: str, got: tuple, ref: tuple) -> None:
    """(loss, {name: grad}, {name: param}) equal to the reference's within the tolerance; a
    mismatch names `where` and the tensor."""
    (loss, grads, params), (ref_loss, ref_grads, ref_params) = got, ref
    assert abs(loss - ref_loss) <= ATOL + RTOL * abs(ref_loss), (where, loss, ref_loss)
    for kind, tensors, refs in (("grad", grads, ref_grads), ("param", params, ref_params)):
        for name, tensor in tensors.items():
            torch.testing.assert_close(tensor, refs[name], atol=ATOL, rtol=RTOL,
                                       msg=lambda m, n=name, k=kind: f"{where} {k} {n}: {m}")


def parity_rank(*, rank: int, world_size: int, spec_dicts: list[dict],
                micro_batched: bool = False) -> list[dict]:
    """Every check runs on the ranks (a mismatch raises there, with the parameter's name);
    `micro_batched`: against one process that runs the layout's micro-batches."""
    report = []
    for spec_dict in spec_dicts:
        spec = spec_from_dict(RunSpec, spec_dict)
        ref_loss, ref_grads, ref_params = reference_update(spec, micro_batched=micro_batched)
        loss, grads, params, memory = layout_update(spec, rank)
        check_memory(spec, rank, memory)
        assert_same_update(f"layout {spec.parallel.name}", (loss, grads, params),
                           (ref_loss, ref_grads, ref_params))
        report.append({"layout": spec.parallel.name, "names": sorted(grads),
                       "loss": loss, "ref_loss": ref_loss, "memory": memory})
    return report


def check_groups(layout) -> None:
    """The torch mesh's process groups are the groups the dry run shows (ParallelDims.peers)."""
    axes = {"tp": ("tp",), "cp": ("cp",), "pp": ("pp",), "dp": ("dp_replicate", "dp_shard"),
            "dp_cp": ("dp_replicate", "dp_shard", "cp")}
    for name, dims_axes in axes.items():
        group = layout.group(name)
        ranks = dist.get_process_group_ranks(group) if group is not None else [layout.rank]
        assert sorted(ranks) == layout.dims.peers(layout.rank, dims_axes), (name, ranks)
    if layout.dims.ep > 1:  # the experts' all-to-all group is the one the dry run shows
        ranks = dist.get_process_group_ranks(layout.group("ep"))
        assert sorted(ranks) == layout.dims.ep_peers(layout.rank), ("ep", ranks)


def check_memory(spec: RunSpec, rank: int, held: dict[str, int]) -> None:
    """The plan's per-rank static estimate equals what this rank holds, within 1%."""
    from parallel.cost.memory import static_bytes

    estimate = static_bytes(spec, rank)
    for kind, value in held.items():
        expected = getattr(estimate, kind)
        assert abs(value - expected) <= 0.01 * expected, (
            f"layout {spec.parallel.name} rank {rank} {kind}: holds {value} B, "
            f"plan says {expected} B")
