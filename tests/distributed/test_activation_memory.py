"""The plan's activation term per rank (parallel.cost.memory.layout_activation_bytes) EQUALS
what one forward keeps for backward on that rank (tests/support/activation_memory.py:
storages alive after forward, weights and autocast's weight casts apart), for the parity
layouts without pipelining, every recompute policy family and fp32 / bf16 (autocast over
fp32 weights for ddp, zero1, tp, cp; FSDP mixed precision for zero 2/3), with sequence
parallel and loss parallel on and off, the head and loss in row blocks (training.loss_chunks)
under ddp, zero3 and cp. Equal up to the loss's two fp32 scalars (8 bytes; 4 in row blocks).
In the same spawns, the same step goes on through backward, clipping and AdamW, and its
peak (every tensor storage alive at once, tests/support/peak_memory.py) is the plan's
(estimate_memory(spec, rank=...).total) within PEAK_TOLERANCE, on every rank (measured
peak / plan: 0.92-1.08 without pipelining, 1.005-1.08 with, one known gap at 1.116).

Pipeline layouts too (PIPELINES_*): their forwards and backwards interleave inside the
schedule, so the kept bytes are read at every chunk's forward exit and backward entry, the
largest reading against the plan (tests/support/pipeline_memory.py).

Mixture-of-experts layouts (MOE_*: tiny_moe, a dense block then two MoE blocks, q/k norms,
dropless top-2 of 4 experts) on one process and under ep2 x zero3, every policy, fp32 and
bf16, with the dense layouts' tolerances. Routing rule: how many token copies a rank's
experts receive depends on the router, so the plan (a balanced load: k copies per token on
every rank) is moved by the bytes each copy keeps (expert_activations.expert_bytes_per_copy)
x (copies received - copies sent), both counted from the routers' loads of the same forward
(tests/support/activation_memory.py `routed_copies`); on one process they are equal, so
that plan is checked as it is. Their peaks are the plan's within PEAK_TOLERANCE as well (the
balanced plan's; under ep FSDP gathers and reduces the rank's E/ep experts per MoE block). The static terms (params, grads, optimizer state)
are checked on every rank of every parity layout (tests/support/layout_parity.py
`check_memory`). Configurations are grouped by world size, one spawn each."""
from __future__ import annotations

import dataclasses

import pytest

from conf.run_dir.spec_io import spec_to_dict
from tests.support.activation_memory import PEAK_TOLERANCE, activation_rank
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec

pytestmark = pytest.mark.distributed

from tests.support.layouts import (FOUR_RANKS as PARITY_FOUR_RANKS,
                                   TWO_RANKS as PARITY_TWO_RANKS)

BASE = ("model=tiny", "model.n_layers=2", "data=synthetic", "training.seq_len=32",
        "training.micro_batch_size=2", "training.grad_accum_steps=1")
SCALARS = 8  # the loss sum and cross entropy's total weight, fp32
CHUNKED_SCALARS = 4
"""With training.loss_chunks > 1 only the loss sum: each block's cross entropy is gone."""



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
ALTERNATE_TWO_RANKS = {name: TWO_RANKS[name] for name in ("tp_sp", "tp_no_sp", "zero3",
                                                         "cp_balanced")}
"""torchtitan's op SAC (every second matmul kept) where the matmuls are DTensor ops (tp, with
and without SP's reduce-scatter), gathered by FSDP, and under cp's attention."""

MOE_BASE = ("model=tiny_moe", *BASE[2:])
MOE_LAYOUTS = {
    1: {"moe": [],
        "moe_shared_sigmoid": ["model.moe.num_shared_experts=1", "model.moe.score=sigmoid",
                               "model.moe.seq_aux_loss=true", "model.moe.renormalize=false",
                               "model.moe.route_scale=2.5",
                               "checkpoint.export_safetensors=false"]},
    2: {"moe_ep2_zero3": ["parallel=ep"]},
    4: {"moe_ep2_zero3_efsdp2": ["parallel=ep"]},
}
"""One process (autocast in bf16), also with a shared expert, a sigmoid router without
renormalisation and the per-sequence balancing loss; ep2 x zero3 on 2 ranks (FSDP mixed
precision in bf16; the experts' all-to-all dispatch and combine, each rank two of the four
experts) and on 4 (each expert's FSDP over 2 ranks)."""

PIPELINES_TWO_RANKS = {  # name: (overrides, recompute policies)
    "pp_1f1b": (PARITY_TWO_RANKS["pp_1f1b"], ["none", "full"]),
    "pp_gpipe": (["parallel=pp", "parallel.pp_schedule=gpipe"], ["none"]),
    "pp_interleaved": ([*PARITY_TWO_RANKS["pp_interleaved"], "model.n_layers=4"],
                       ["selective"]),
}
PIPELINES_FOUR_RANKS = {
    "pp4_1f1b": (["parallel=pp", "parallel.pp=4", "model.n_layers=4",
                  "training.micro_batch_size=4"], ["none"]),
    "pp2_tp2": (PARITY_FOUR_RANKS["pp2_tp2"], ["full"]),
    "pp2_dp2": (PARITY_FOUR_RANKS["pp2_dp2"], ["none"]),
    "pp2_dp2_wide": ([*PARITY_FOUR_RANKS["pp2_dp2"], "model.dim=256", "model.ffn_dim=1024",
                      "model.n_layers=4"], ["none"]),
}
"""Pipeline layouts (tests/support/pipeline_memory.py), in the same spawns: every
schedule family (1F1B, GPipe, interleaved with virtual stages), a 4-stage pipeline (each rank
its own number of micro-batches in flight), tp without loss parallel (split stage outputs,
whole logits) and FSDP (a bf16 residual stream; and with weights large beside the
activations, pp2_dp2_wide, where the step peaks at the stage's gradient reduce: every unit
gathered and every gradient whole, step_memory_terms.pipeline_grad_reduce; 11-16% above the
plan without that phase)."""
PIPELINE_SCALARS = 4, 12
"""A pipeline rank keeps, besides the plan's activations, the step's fp32 loss sum (4 bytes)
and, on the last stage, up to three fp32 scalars per micro-batch's loss (its sum, cross
entropy's total weight, the scaled loss)."""


def _pipeline_specs(layouts: dict[str, tuple[list[str], list[str]]], world: int) -> list:
    return [spec for name, (extra, policies) in layouts.items()
            for spec in _specs({name: extra}, world, policies)]


def _specs(layouts: dict[str, list[str]], world: int, policies: list[str],
           base: tuple[str, ...] = BASE) -> list:
    """Every layout x precision x policy; composed once per layout and precision (composing
    costs most of a second), the policy's section swapped in."""
    recompute = {policy: cpu_spec(*base, f"recompute={policy}").recompute
                 for policy in policies}
    specs = []
    for name, extra in layouts.items():
        for precision in PRECISIONS:
            spec = cpu_spec(*base, f"cluster.procs_per_node={world}", f"precision={precision}",
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
                         "[tokens / tp, dim] bf16 share). Seen with the debug listing: in "
                         "fp32 block 0's RMSNorm saves its input itself (x.float() is a no-op), "
                         "which keeps the embedding's reduce-scatter output and its DTensor "
                         "views alive; under FSDP bf16 it saves its fp32 upcast instead, and "
                         "none of the embedding's copies is kept (a checkpoint holding the "
                         "block input, as under selective, keeps them again). Fix: "
                         "embedding_bytes_per_token 0 when the residual stream is not fp32 and "
                         "block 0 is not checkpointed (not done yet)",
    "cp2_tp2-bf16-none": "as dp2_tp2-bf16-none, with cp (8 KiB: half the tokens)",
    "pp4_1f1b-fp32-none@2": "pipeline rank 2 of 4 keeps one [tokens, dim] fp32 tensor (8 KiB) "
                            "more than its pp - rank = 2 chunks in flight; ranks 0, 1, 3 "
                            "are exact; not explained yet",
    "pp4_1f1b-bf16-none@2": "as pp4_1f1b-fp32-none@2 (the residual stream is fp32 under "
                            "autocast)",
    "pp2_tp2-fp32-full@2": "the last pipeline stage under tp without loss parallel, in fp32 "
                           "only, keeps 24 KiB (3 x [tokens, dim] fp32, or the local logits "
                           "shard + one) more than the plan, with any policy; exact in bf16; "
                           "not explained yet",
    "pp2_tp2-fp32-full@3": "as pp2_tp2-fp32-full@2",
    "pp2_dp2-bf16-none@2": "the last pipeline stage under FSDP mixed precision keeps 4 KiB "
                           "(one [tokens, dim] bf16) more than the plan; exact in fp32; not "
                           "explained yet",
    "pp2_dp2-bf16-none@3": "as pp2_dp2-bf16-none@2",
    "pp2_dp2_wide-bf16-none@2": "as pp2_dp2-bf16-none@2",
    "pp2_dp2_wide-bf16-none@3": "as pp2_dp2-bf16-none@2",
}
"""Configurations (`name`, or `name@rank` for one rank) where the plan is known to be wrong:
checked to STILL be wrong, so the entry goes when the formula is fixed."""


"""PEAK_TOLERANCE (tests/support/activation_memory.py): the step's peak is the plan's within
10% (issue 10's target; a miss is measured again, PEAK_TRIES says why): the plan walks phases
(parallel.cost.peak), not every op; what it leaves out (backward's gradient temporaries: a
weight's new gradient before it is added to the held one, compute-dtype weight gradients
waiting for their cast back under autocast) is below that here, but for PEAK_KNOWN_GAPS.
Closest to the edge: pp2_tp2 fp32 full, whose first stage peaks in a re-computed block's
backward ~8.5% above the plan (tp's all-gathered re-computed inputs and those gradient
temporaries; it was 11.6% and a known gap while CPU AdamW ran per tensor)."""
PEAK_KNOWN_GAPS: dict[str, str] = {}
"""Peaks known to be off by more than PEAK_TOLERANCE: checked to STILL be off."""


def _gap(row: dict, gaps: dict) -> bool:
    return row["name"] in gaps or f"{row['name']}@{row['rank']}" in gaps


def _kept_as_planned(row: dict) -> bool:
    extra = row["measured"] - row["plan"]
    if not row.get("microbatches"):
        return extra == (CHUNKED_SCALARS if row.get("loss_chunks", 1) > 1 else SCALARS)
    step, per_loss = PIPELINE_SCALARS
    return step <= extra <= step + per_loss * row["microbatches"]


def _check(results: list[list[dict]]) -> None:
    rows = [row for ranks in results for row in ranks]
    wrong = [f"{row['name']} rank {row['rank']}: kept {row['measured']} B, plan "
             f"{row['plan']} B" for row in rows
             if _kept_as_planned(row) == _gap(row, KNOWN_GAPS)]
    wrong += [f"{row['name']} rank {row['rank']}: step peak {row['peak']} B (at op "
              f"{row['peak_at']}), plan {row['plan_peak']} B"
              for row in rows
              if (abs(row["peak"] / row["plan_peak"] - 1) > PEAK_TOLERANCE)
              != _gap(row, PEAK_KNOWN_GAPS)]
    assert not wrong, "\n".join(wrong)


def test_two_rank_activations_equal_the_plan(tmp_path):
    specs = (_specs(TWO_RANKS, 2, POLICIES) + _pipeline_specs(PIPELINES_TWO_RANKS, 2)
             + _specs(ALTERNATE_TWO_RANKS, 2, ["selective_alternate"]))
    _check(run_on_ranks(activation_rank, world_size=2, workdir=tmp_path, timeout_s=600,
                        kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]}))


def test_four_rank_activations_equal_the_plan(tmp_path):
    specs = (_specs(FOUR_RANKS, 4, ["none", "full", "selective"])
             + _pipeline_specs(PIPELINES_FOUR_RANKS, 4))
    _check(run_on_ranks(activation_rank, world_size=4, workdir=tmp_path, timeout_s=900,
                        kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]}))


@pytest.mark.parametrize("world", sorted(MOE_LAYOUTS))
def test_moe_activations_equal_the_plan(tmp_path, world):
    specs = _specs(MOE_LAYOUTS[world], world, POLICIES, base=MOE_BASE)
    results = run_on_ranks(activation_rank, world_size=world, workdir=tmp_path, timeout_s=600,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    routed = [row["routed"] for ranks in results for row in ranks]
    assert all(len(blocks) == 2 for blocks in routed)  # the two MoE blocks, counted
    if world > 1:  # the check above really moved the plan: the ranks' loads differ
        assert any(sent != received for blocks in routed for sent, received in blocks.values())
    _check(results)
