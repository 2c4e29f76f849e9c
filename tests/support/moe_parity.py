"""Rank-side code of the MoE layout parity test: one AdamW update of an MoE model under a
two-rank layout against one process that runs the same micro-batches in turn.

The balancing loss is a product of batch means (f_i x P_i): every layout computes it per
micro-batch per rank (as Megatron and torchtitan do), weighted by tokens. So the reference
is not one global micro-batch (tests/support/layout_parity.py) but every rank's micro-batches
accumulated in one process: the same partition, the same loss, exactly. Compared: the loss,
every gradient (the routers' included), every parameter after the step, the sigmoid
router's balancing bias after its update, and the plan's static memory per rank.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from conf.run_dir.spec_io import spec_from_dict
from conf.spec import RunSpec
from tests.support.layout_parity import (CPU, assert_same_update, check_memory, full,
                                         held_bytes, layout_micro_batches, local_bytes,
                                         named_params)

NO_AUTOCAST = torch.autocast("cpu", enabled=False)


def expert_biases(parts) -> dict[str, torch.Tensor]:
    from training.router_losses import moe_layers

    return {f"layers.{i}.moe.expert_bias": m.expert_bias.clone()
            for i, m in moe_layers(parts).items() if m.expert_bias is not None}


def reference_update(spec: RunSpec):
    from training.model_builder import build_model
    from training.optim import build_optimizer
    from training.parallel_model import ParallelModel
    from training.router_losses import update_expert_biases
    from training.step import clip_and_step, forward_backward

    model = build_model(spec.model, device=CPU, seed=spec.training.seed)
    layout = ParallelModel.single(model)
    optimizer = build_optimizer(model, optim=spec.optim,
                                state_dtype=spec.precision.optimizer_state_dtype)
    loss = forward_backward(layout, layout_micro_batches(spec), device=CPU, autocast=NO_AUTOCAST)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    clip_and_step(layout, [optimizer], grad_clip=spec.optim.grad_clip)
    update_expert_biases([model])
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return float(loss.local_loss_sum) / loss.global_tokens, grads, params, expert_biases([model])


def layout_update(spec: RunSpec, rank: int):
    from training.data.build import build_train_batches
    from training.optim import build_optimizers
    from training.parallel_model import build_parallel_model
    from training.router_losses import update_expert_biases
    from training.step import clip_and_step, forward_backward

    layout = build_parallel_model(spec, rank=rank, device=CPU)
    optimizers = build_optimizers(layout, optim=spec.optim,
                                  state_dtype=spec.precision.optimizer_state_dtype)
    batches = build_train_batches(spec.data, spec.training, dp_rank=layout.dims.dp_rank(rank),
                                  dp_size=layout.dims.dp).next_step()
    loss = forward_backward(layout, batches, device=CPU, autocast=NO_AUTOCAST)
    own = torch.tensor([float(loss.local_loss_sum) if layout.reports_loss else 0.0],
                       dtype=torch.float64)  # one rank per tp group
    dist.all_reduce(own)
    grads = {n: full(p.grad) for n, p in named_params(layout).items()}
    grads_bytes = local_bytes(p.grad for p in named_params(layout).values())
    clip_and_step(layout, optimizers, grad_clip=spec.optim.grad_clip)
    update_expert_biases(layout.parts, group=layout.group("dp_cp"))
    params = {n: full(p) for n, p in named_params(layout).items()}
    memory = held_bytes(layout, optimizers, grads_bytes=grads_bytes)
    return own.item() / loss.global_tokens, grads, params, expert_biases(layout.parts), memory


def moe_parity_rank(*, rank: int, world_size: int, spec_dicts: list[dict]) -> list[dict]:
    report = []
    for spec_dict in spec_dicts:
        spec = spec_from_dict(RunSpec, spec_dict)
        ref_loss, ref_grads, ref_params, ref_biases = reference_update(spec)
        loss, grads, params, biases, memory = layout_update(spec, rank)
        check_memory(spec, rank, memory)
        where = f"layout {spec.parallel.name} ({spec.model.moe.score})"
        assert_same_update(where, (loss, grads, params), (ref_loss, ref_grads, ref_params))
        assert biases.keys() == ref_biases.keys()
        for name, bias in biases.items():
            torch.testing.assert_close(bias, ref_biases[name], msg=f"{where} {name}")
        report.append({"layout": spec.parallel.name, "names": sorted(grads), "loss": loss,
                       "biases": sorted(biases),
                       "router_grad": float(grads["layers.1.moe.router.weight"].norm())})
    return report


def _grad_norm(layout) -> float:
    """The global gradient norm the step clips by (routers and experts whole over tp counted
    once: ParallelModel.uncounted_in_norm)."""
    from parallel.grad_norm import clip_grads

    return float(clip_grads(layout.parameters(), max_norm=float("inf"),
                            pp_group=layout.group("pp"), uncounted=layout.uncounted_in_norm()))


def routing_parity_rank(*, rank: int, world_size: int, spec_dicts: list[dict]) -> list[dict]:
    """The routing metrics a logged step reads (training/routing_metrics.py: loads and router
    losses summed over the dp x cp ranks, every pipeline stage's blocks gathered, torch's
    shape-inference forward not counted; under tp with sequence parallel each rank's share
    summed over tp: MoE.shard_tokens) and the gradient norm equal one process's over the same
    micro-batches."""
    import pytest

    from training.data.build import build_train_batches
    from training.model_builder import build_model
    from training.parallel_model import ParallelModel, build_parallel_model
    from training.routing_metrics import routing_fields
    from training.step import forward_backward

    report = []
    for spec_dict in spec_dicts:
        spec = spec_from_dict(RunSpec, spec_dict)
        model = build_model(spec.model, device=CPU, seed=spec.training.seed)
        reference = ParallelModel.single(model)
        forward_backward(reference, layout_micro_batches(spec), device=CPU,
                         autocast=NO_AUTOCAST)
        expected = {**routing_fields([model]), "grad_norm": _grad_norm(reference)}
        layout = build_parallel_model(spec, rank=rank, device=CPU)
        batches = build_train_batches(spec.data, spec.training, dp_rank=layout.dims.dp_rank(rank),
                                      dp_size=layout.dims.dp).next_step()
        forward_backward(layout, batches, device=CPU, autocast=NO_AUTOCAST)
        got = {**routing_fields(layout.parts, group=layout.group("dp_cp"),
                                pp_group=layout.group("pp")), "grad_norm": _grad_norm(layout)}
        where = f"layout {spec.parallel.name} routing metrics"
        assert got.keys() == expected.keys(), (where, sorted(got), sorted(expected))
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (where, key, got[key])
        report.append(got)
    return report
