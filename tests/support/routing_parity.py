"""Rank-side check that a layout's routing metrics and gradient norm equal one process's (MoE
models): after one step's forward and backward on the same global batch, the fields
training/routing_metrics logs (each block's expert loads, busiest share, dropped share,
balancing and z-loss), reduced over the layout's dp x cp ranks as the loop reduces them, and
the global gradient norm the step clips by are the single-process model's.
Under tensor parallel with sequence parallel each tp rank routes its share of the sequence,
so this holds only if the router statistics are summed over tp (MoE.shard_tokens).
"""
from __future__ import annotations

import math

import torch

from conf.run_dir.spec_io import spec_from_dict
from conf.spec import RunSpec
from tests.support.layout_parity import CPU, parity_rank, reference_batches

REL = 1e-5


def _fields(layout, batches) -> dict[str, float]:
    """The routing fields after one step's forwards and backwards, and `grad_norm`: the
    global gradient norm the step clips by (routers and experts counted once over tp)."""
    from parallel.grad_norm import clip_grads
    from training.routing_metrics import routing_fields
    from training.step import forward_backward

    forward_backward(layout, batches, device=CPU, autocast=torch.autocast("cpu", enabled=False))
    norm = clip_grads(layout.parameters(), max_norm=float("inf"), pp_group=layout.group("pp"),
                      uncounted=layout.uncounted_in_norm())
    return {**routing_fields(layout.parts, group=layout.group("dp_cp")), "grad_norm": norm}


def routing_rank(*, rank: int, spec_dict: dict) -> dict[str, float]:
    """The layout's routing fields on this rank; raises where one differs from one
    process's (names the field)."""
    from training.data.build import build_train_batches
    from training.model_builder import build_model
    from training.parallel_model import ParallelModel, build_parallel_model

    spec = spec_from_dict(RunSpec, spec_dict)
    reference = ParallelModel.single(build_model(spec.model, device=CPU, seed=spec.training.seed))
    expected = _fields(reference, reference_batches(spec))
    layout = build_parallel_model(spec, rank=rank, device=CPU)
    batches = build_train_batches(spec.data, spec.training, dp_rank=layout.dims.dp_rank(rank),
                                  dp_size=layout.dims.dp).next_step()
    got = _fields(layout, batches)
    assert expected and set(got) == set(expected), (sorted(got), sorted(expected))
    for name, value in expected.items():
        assert math.isclose(got[name], value, rel_tol=REL, abs_tol=1e-7), (
            f"layout {spec.parallel.name} {name}: {got[name]} != one process's {value}")
    return got


def parity_and_routing_rank(*, rank: int, world_size: int, spec_dicts: list[dict],
                            routing: list[dict]) -> list[dict]:
    """parity_rank for `spec_dicts`, then routing_rank for `routing` (one spawn)."""
    rows = parity_rank(rank=rank, world_size=world_size, spec_dicts=spec_dicts)
    for spec_dict in routing:
        routing_rank(rank=rank, spec_dict=spec_dict)
    return rows
