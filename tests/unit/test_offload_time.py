"""Activation offload's host-link term of the step-time model (parallel/cost/offload.py) and
the host link of the device catalogue. Torch-free."""
from __future__ import annotations

import dataclasses
from functools import lru_cache

import pytest

from conf.errors import ConfigError
from conf.schema import RecomputeMode
from conf.spec import RecomputeSpec
from parallel.cost.activations import ActivationSplit, activation_bytes, activation_dtypes
from parallel.cost.devices import device_facts
from parallel.cost.memory import weight_copy_bytes
from parallel.cost.offload import offload_bytes_per_step
from parallel.cost.params import held_layers
from parallel.cost.plan import make_plan
from parallel.cost.step_time import estimate_time, hardware_of
from tests.support.specs import cpu_spec

GPU = ("model=llama3_1b", "cluster=slurm", "cluster.gpu_name=H100", "training.device=cuda",
       "precision=bf16", "training.seq_len=4096", "training.micro_batch_size=2",
       "training.global_batch_size=16", "training.grad_accum_steps=-1", "data=synthetic",
       "cluster.calibration=none", "cluster.gpus_per_node=8")


@lru_cache(maxsize=None)
def spec(*overrides: str):
    return cpu_spec(*GPU, *overrides)


def _moved_by_the_memory_model(s) -> int:
    """Per step, on the busiest pipeline rank: what the memory model keeps on the device under
    none minus under offload (activations and autocast weight copies), per micro-batch pass."""
    p, t = s.parallel, s.training
    none = RecomputeSpec(mode=RecomputeMode.none)
    micro_batch = t.micro_batch_size // p.pp_microbatches
    kwargs = dict(tokens=micro_batch * t.seq_len // p.cp, micro_batch=micro_batch,
                  device_type="cuda", with_head=False, with_embedding=False,
                  split=ActivationSplit.of(p),
                  dtypes=activation_dtypes(s.precision, uses_fsdp=p.uses_fsdp))
    per_rank = []
    for pp_rank in range(p.pp):
        layers = held_layers(s, pp_rank)
        kept = [activation_bytes(s.model, layers=layers, recompute=r, **kwargs)
                for r in (none, s.recompute)]
        rank = pp_rank * (s.world_size // p.pp)
        copies = weight_copy_bytes(dataclasses.replace(s, recompute=none), rank) - \
            weight_copy_bytes(s, rank)
        per_rank.append(kept[0] - kept[1] + copies)
    return t.grad_accum_steps * p.pp_microbatches * max(per_rank)


@pytest.mark.parametrize("layout", [("parallel=fsdp",), ("parallel=ddp",),
                                    ("parallel=ddp", "recompute.every_n_layers=2"),
                                    ("parallel=fsdp", "parallel.tp=2", "parallel.dp_shard=4",
                                     "model.tie_embeddings=false"),
                                    ("parallel=fsdp", "parallel.pp=2", "parallel.dp_shard=4",
                                     "parallel.pp_microbatches=2", "model.tie_embeddings=false")])
def test_offload_moves_what_the_memory_model_stops_keeping(layout):
    """The bytes out (and back) per step are the memory model's none-minus-offload
    difference: activations, and under autocast (ddp) the bf16 weight copies. (Mutations
    tried: the weight copies left out -> the ddp cases fail; every block counted instead of
    the covered ones -> every_n_layers=2 fails.) The pipeline case runs FSDP: under a
    pipeline's autocast the weight copies stay in autocast's cast cache for the whole step
    (parallel.cost.memory.autocast_cache_policy), so the memory model frees none of them,
    yet offload's pack hook still copies them out: traffic, not memory (next test)."""
    s = spec(*layout, "recompute.mode=offload")
    assert offload_bytes_per_step(s) == _moved_by_the_memory_model(s) > 0


def test_a_pipeline_under_autocast_still_moves_the_weight_copies():
    """ddp + pp in bf16: the same bytes move as with the copies counted block by block, and
    more than the memory model frees (the copies stay cached on the device)."""
    s = spec("parallel=ddp", "parallel.pp=2", "parallel.dp_replicate=4",
             "parallel.pp_microbatches=2", "model.tie_embeddings=false", "recompute.mode=offload")
    flat = spec("parallel=ddp", "parallel.dp_replicate=8", "model.tie_embeddings=false",
                "training.micro_batch_size=1", "recompute.mode=offload")
    # one micro-batch (1 sequence) through one block: flat makes grad_accum passes of 16
    per_block = offload_bytes_per_step(flat) // (flat.training.grad_accum_steps * 16)
    passes = s.training.grad_accum_steps * s.parallel.pp_microbatches  # 2 x 2, of 8 blocks
    assert offload_bytes_per_step(s) == passes * 8 * per_block
    assert offload_bytes_per_step(s) > _moved_by_the_memory_model(s)


def test_offload_charges_the_host_link_in_full():
    """offload_s = 2 x bytes / host link (out in forward, back in backward, nothing hidden),
    and it is in the step: offload is slower than none by exactly that on the same layout.
    (Mutations tried: the offload term dropped from the step -> fails; one direction only
    -> fails; the term hidden under compute -> fails.)"""
    none, off = (spec("parallel=fsdp", f"recompute.mode={m}") for m in ("none", "offload"))
    e_none, e_off = (estimate_time(s, make_plan(s)) for s in (none, off))
    gbps = device_facts("H100").host_link_gbps
    expected = 2 * offload_bytes_per_step(off) / (gbps * 1e9)
    assert e_off.breakdown.offload_s == pytest.approx(expected)
    assert e_off.step_s - e_none.step_s == pytest.approx(expected)
    assert e_none.breakdown.offload_s == 0.0


def test_the_host_link_knob_and_the_catalogue():
    """cluster.host_link_gbps overrides the catalogue (PCIe4 A100 < PCIe5 H100 < C2C GH200);
    a CPU run moves nothing; a negative knob is named."""
    assert device_facts("A100").host_link_gbps < device_facts("H100").host_link_gbps < \
        device_facts("NVIDIA GH200 480GB").host_link_gbps
    assert device_facts("NVIDIA GH200 480GB").key == "GH200"
    off = spec("parallel=fsdp", "recompute.mode=offload")
    slow = spec("parallel=fsdp", "recompute.mode=offload", "cluster.host_link_gbps=5")
    assert hardware_of(slow).host_gbps == 5.0 and hardware_of(slow).sources[
        "host_link_gbps"] == "cluster"
    assert estimate_time(slow, make_plan(slow)).breakdown.offload_s == pytest.approx(
        estimate_time(off, make_plan(off)).breakdown.offload_s * 50 / 5)
    cpu = cpu_spec("model=tiny", "data=synthetic", "recompute.mode=offload",
                   "cluster.calibration=none")
    assert offload_bytes_per_step(cpu) == 0
    with pytest.raises(ConfigError, match="cluster.host_link_gbps"):
        spec("cluster.host_link_gbps=-1")


def test_offload_loses_to_keeping_activations_when_they_fit():
    """The search ranks by predicted tokens/s: with the host copies charged, an 8B FSDP
    layout on H100 that fits without offload is predicted faster without it (before the term
    offload tied none and ranked first on headroom)."""
    base = ("model=llama3_8b", "parallel=fsdp", "training.seq_len=8192",
            "training.micro_batch_size=1", "training.global_batch_size=8")
    none, off = (spec(*base, f"recompute.mode={m}") for m in ("none", "offload"))
    t_none, t_off = (estimate_time(s, make_plan(s)).tokens_per_s_per_device for s in (none, off))
    assert t_off < 0.8 * t_none
