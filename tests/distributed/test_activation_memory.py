"""The plan's activation term per rank (parallel.cost.memory.layout_activation_bytes) EQUALS
what one forward keeps for backward on that rank (tests/distributed/activation_memory.py:
storages alive after forward, weights and autocast's weight casts apart), for the parity
layouts without pipelining, every recompute policy family and fp32 / bf16 (autocast over
fp32 weights for ddp, zero1, tp, cp; FSDP mixed precision for zero 2/3), with sequence
parallel and loss parallel on and off. Equal up to the loss's two fp32 scalars (8 bytes).
In the same spawns, the same step goes on through backward, clipping and AdamW, and its
peak (every tensor storage alive at once, tests/distributed/peak_memory.py) is the plan's
(estimate_memory(spec, rank=...).total) within PEAK_TOLERANCE, on every rank.

Pipeline layouts are not here: their forward and backward interleave inside the schedule, so
"alive after forward" is not one moment. The static terms (params, grads, optimizer state)
are checked on every rank of every parity layout (tests/distributed/layout_parity.py
`check_memory`). Configurations are grouped by world size, one spawn each."""
from __future__ import annotations

import dataclasses

import pytest

from conf.spec_io import spec_to_dict
from tests.distributed.activation_memory import activation_rank
from tests.distributed.spawn import run_on_ranks
from tests.support.specs import cpu_spec

pytestmark = pytest.mark.distributed

from tests.support.layouts import (FOUR_RANKS as PARITY_FOUR_RANKS,
                                   TWO_RANKS as PARITY_TWO_RANKS)

BASE = ("model=tiny", "model.n_layers=2", "data=synthetic", "training.seq_len=32",
        "training.micro_batch_size=2", "training.grad_accum_steps=1")
SCALARS = 8  # the loss sum and cross entropy's total weight, fp32



def _measurable(layouts: dict[str, list[str]]) -> dict[str, list[str]]:
    """The parity layouts with one moment "after forward": no pipeline (its schedule interleaves
    forward and backward), and no recompute override (the policies are looped here)."""
    return {name: overrides for name, overrides in layouts.items()
            if not any(o.startswith(("parallel=pp", "parallel.pp=", "recompute="))
                       for o in overrides)}


TWO_RANKS = {**_measurable(PARITY_TWO_RANKS),
             "tp_no_sp_loss_parallel": ["parallel=tp", "parallel.sequence_parallel=false",
                                        "parallel.loss_parallel=true"]}
FOUR_RANKS = _measurable(PARITY_FOUR_RANKS)
POLICIES = ["none", "full_every2", "selective", "selective_attention"]
"""full_every2 re-computes block 0 whole and keeps block 1 whole; offload keeps what none keeps
on a CPU device (tests/unit/test_recompute.py)."""
PRECISIONS = ["fp32", "bf16"]


def _specs(layouts: dict[str, list[str]], world: int, policies: list[str]) -> list:
    """Every layout x precision x policy; composed once per layout and precision (composing
    costs most of a second), the policy's section swapped in."""
    recompute = {policy: cpu_spec(*BASE, f"recompute={policy}").recompute
                 for policy in policies}
    specs = []
    for name, extra in layouts.items():
        for precision in PRECISIONS:
            spec = cpu_spec(*BASE, f"cluster.procs_per_node={world}", f"precision={precision}",
                            *extra)
            specs += [dataclasses.replace(
                spec, recompute=recompute[policy],
                parallel=dataclasses.replace(spec.parallel,
                                             name=f"{name}-{precision}-{policy}"))
                for policy in policies]
    return specs


KNOWN_GAPS = {
    "dp2_tp2-bf16-none": "FSDP + tp in bf16 without recompute keeps 16 KiB less than the plan: "
                         "the same with 1, 2 or 3 blocks (so not per block), halved under cp, "
                         "the size of the plan's embedding term here (4 copies of the rank's "
                         "[tokens / tp, dim] bf16 share); which copies go is not explained yet",
    "cp2_tp2-bf16-none": "as dp2_tp2-bf16-none, with cp (8 KiB: half the tokens)",
}
"""Configurations where the plan is known to be wrong: checked to STILL be wrong, so the
entry goes when the formula is fixed."""


PEAK_TOLERANCE = 0.10
"""The step's peak is the plan's within 10% (issue 10's target): the plan walks phases
(parallel.cost.peak), not every op; what it leaves out (backward's gradient temporaries, the
loss's gathered logits under tp) is below that here."""


def _check(results: list[list[dict]]) -> None:
    wrong = [f"{row['name']} rank {row['rank']}: kept {row['measured']} B, plan "
             f"{row['plan']} B" for rows in results for row in rows
             if (row["measured"] - row["plan"] != SCALARS) != (row["name"] in KNOWN_GAPS)]
    wrong += [f"{row['name']} rank {row['rank']}: step peak {row['peak']} B (at op "
              f"{row['peak_at']}), plan {row['plan_peak']} B"
              for rows in results for row in rows
              if abs(row["peak"] / row["plan_peak"] - 1) > PEAK_TOLERANCE]
    assert not wrong, "\n".join(wrong)


def test_two_rank_activations_equal_the_plan(tmp_path):
    specs = _specs(TWO_RANKS, 2, POLICIES)
    _check(run_on_ranks(activation_rank, world_size=2, workdir=tmp_path, timeout_s=600,
                        kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]}))


def test_four_rank_activations_equal_the_plan(tmp_path):
    specs = _specs(FOUR_RANKS, 4, ["none", "full", "selective"])
    _check(run_on_ranks(activation_rank, world_size=4, workdir=tmp_path, timeout_s=600,
                        kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]}))
