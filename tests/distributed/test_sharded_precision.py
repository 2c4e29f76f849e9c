"""Precision policies where state is sharded (2 gloo ranks, FSDP2 zero 3):
- bf16: FSDP's mixed-precision policy gathers bf16 weights for compute, keeps fp32 master
  shards, and the loss stays within bf16 noise of the fp32 reference;
- fp16: an overflow in one rank's gradient shard skips the step on every rank and halves the
  scale everywhere (no rank's weights drift apart), then training goes on;
- bf16 optimizer state: AdamW moments are stored in bf16 and hold the bytes the plan says."""
from __future__ import annotations

import pytest
import torch

from conf.spec import RunSpec
from conf.run_dir.spec_io import spec_from_dict, spec_to_dict
from tests.support.layout_parity import CPU, full, local_bytes, named_params
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec

pytestmark = pytest.mark.distributed
BASE = ("model=tiny", "data=synthetic", "training.seq_len=32", "training.micro_batch_size=2",
        "parallel=zero3", "cluster.procs_per_node=2")


def _setup(spec: RunSpec, rank: int):
    from training.data.build import build_train_batches
    from training.parallel_model import build_parallel_model
    from training.optim import build_optimizers
    from training.precision import autocast_context, build_grad_scaler

    layout = build_parallel_model(spec, rank=rank, device=CPU)
    optimizers = build_optimizers(layout, optim=spec.optim,
                                  state_dtype=spec.precision.optimizer_state_dtype)
    batches = build_train_batches(spec.data, spec.training, dp_rank=rank, dp_size=2)
    return layout, optimizers, batches, autocast_context(spec.precision, CPU), \
        build_grad_scaler(spec.precision)


def bf16_rank(*, rank: int, world_size: int, spec_dict: dict) -> dict:
    from training.step import clip_and_step, forward_backward

    spec = spec_from_dict(RunSpec, spec_dict)
    layout, optimizers, batches, autocast, _ = _setup(spec, rank)
    seen = []
    wq = layout.parts[0].layers["0"].attention.wq
    wq.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    loss = forward_backward(layout, batches.next_step(), device=CPU, autocast=autocast)
    clip_and_step(layout, optimizers, grad_clip=1.0)
    masters = {p.dtype for p in named_params(layout).values()}
    moments = {s["exp_avg"].dtype for o in optimizers for s in o.state.values()}
    return {"loss": float(loss.local_loss_sum) / loss.global_tokens, "compute": seen,
            "masters": masters, "moments": moments,
            "optimizer_bytes": sum(local_bytes(s.values()) for o in optimizers
                                   for s in o.state.values())}


def fp16_rank(*, rank: int, world_size: int, spec_dict: dict) -> dict:
    from training.step import clip_and_step, forward_backward

    spec = spec_from_dict(RunSpec, spec_dict)
    layout, optimizers, batches, autocast, scaler = _setup(spec, rank)
    before = {n: full(p) for n, p in named_params(layout).items()}
    forward_backward(layout, batches.next_step(), device=CPU, autocast=autocast, scaler=scaler)
    if rank == 1:  # an overflow in one shard of one rank only
        next(iter(named_params(layout).values())).grad.to_local().view(-1)[0] = float("inf")
    scale = scaler.scale_factor
    clip_and_step(layout, optimizers, grad_clip=1.0, scaler=scaler)
    skipped = all(torch.equal(full(p), before[n]) for n, p in named_params(layout).items())
    halved = scaler.scale_factor == scale / 2
    loss = forward_backward(layout, batches.next_step(), device=CPU, autocast=autocast,
                            scaler=scaler)
    clip_and_step(layout, optimizers, grad_clip=1.0, scaler=scaler)
    moved = any(not torch.equal(full(p), before[n]) for n, p in named_params(layout).items())
    return {"skipped": skipped, "halved": halved, "moved": moved,
            "loss": float(loss.local_loss_sum) / loss.global_tokens}


def test_bf16_compute_with_fp32_masters_and_bf16_moments_under_fsdp(tmp_path):
    from parallel.cost.memory import static_bytes

    fp32 = cpu_spec(*BASE, "precision=fp32")
    bf16 = cpu_spec(*BASE, "precision=bf16", "precision.optimizer_state_dtype=bf16")
    results = run_on_ranks(bf16_rank, world_size=2, workdir=tmp_path,
                           kwargs={"spec_dict": spec_to_dict(bf16)})
    reference = run_on_ranks(bf16_rank, world_size=2, workdir=tmp_path,
                             kwargs={"spec_dict": spec_to_dict(fp32)})
    for rank, result in enumerate(results):
        assert set(result["compute"]) == {torch.bfloat16}
        assert result["masters"] == {torch.float32}
        assert result["moments"] == {torch.bfloat16}
        assert result["optimizer_bytes"] == static_bytes(bf16, rank).optimizer
        assert result["loss"] == pytest.approx(reference[rank]["loss"], rel=1e-2)
        assert reference[rank]["compute"] and set(reference[rank]["compute"]) == {torch.float32}


def test_fp16_overflow_on_one_rank_skips_the_step_on_every_rank(tmp_path):
    spec = cpu_spec(*BASE, "precision=fp16", "precision.loss_scale_init=1024")
    results = run_on_ranks(fp16_rank, world_size=2, workdir=tmp_path,
                           kwargs={"spec_dict": spec_to_dict(spec)})
    for result in results:
        assert result["skipped"] and result["halved"] and result["moved"], result
        assert 0 < result["loss"] < 10
