"""Expert parallelism (parallel.ep) against one process, as every layout is proven
(tests/support/layout_parity.py): with dropless routing, after one AdamW update on the same
global batch (two micro-batches), the loss, every gradient (the router's, which the z-loss
reaches, and every expert's, gathered from its ep rank) and every parameter equal the
single-process reference (fp32, atol 5e-6, rtol 1e-4), and each rank holds the bytes the
plan says. Models: the test-only MoE family (tests/support/toy_moe_family: 4 experts, top-2,
the z-loss in the loss) and the shipped tiny_moe (training/models/moe). One spawn per world
size: 2 ranks (ep2 on both models, ep2 over the cp ranks, and a checkpoint ep2 <-> ep1),
4 ranks (ep2 x zero3: each expert's FSDP over 2 ranks; ep2 x tp2 without sequence parallel;
ep2 x pp2)."""
from __future__ import annotations

import pytest

from conf.run_dir.spec_io import spec_to_dict
from parallel.cost.params import parameter_shapes
from tests.support.layout_parity import parity_rank
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec
from tests.support.toy_moe_family import NAME as TOY_MOE

pytestmark = pytest.mark.distributed

BASE = ("model=tiny", f"model.family={TOY_MOE}", "model.n_kv_heads=-1", "model.n_layers=2",
        "data=synthetic", "training.seq_len=32", "optim.lr=1e-4",
        "training.micro_batch_size=2", "training.grad_accum_steps=2")
SHIPPED = ("model=tiny_moe", *BASE[4:])
"""The shipped MoE family's tiny model (block 0 dense, z-loss on). Its balancing loss is
computed over each rank's micro-batch, so no data-parallel layout (zero3 as well as ep)
equals one process with it on: the parity check turns it off; the checkpoint check keeps it."""
FOUR_RANKS = {
    "ep2_zero3": ["parallel=ep"],  # dp_shard 4: each expert's FSDP over 2 ranks
    "ep2_tp2": ["parallel=ep", "parallel.tp=2", "parallel.sequence_parallel=false"],
}
PIPELINED = ("parallel=ep", "parallel.pp=2", "parallel.dp_shard=2", "parallel.pp_layer_split=[2,1]",
             "model.moe.aux_loss_coef=0", "model.moe.z_loss_coef=0")
"""ep2 x pp2 (1F1B) on tiny_moe: router losses under a pipeline are refused (moe_rules)."""


def _run(tmp_path, layouts: dict[str, list[str]], world: int, *more) -> None:
    specs = [cpu_spec(*BASE, f"cluster.procs_per_node={world}", f"parallel.name={name}", *extra)
             for name, extra in layouts.items()] + list(more)
    results = run_on_ranks(parity_rank, world_size=world, workdir=tmp_path, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    _check(specs, results)


def covered(rows: list[dict]) -> set[str]:
    return set().union(*(row["names"] for row in rows))


def _check(specs: list, results: list) -> None:
    for index, spec in enumerate(specs):
        rows = [rank_rows[index] for rank_rows in results]
        assert {row["layout"] for row in rows} == {spec.parallel.name}
        assert any(name.endswith("moe.experts.w2") for name in rows[0]["names"])
        assert any(name.endswith("moe.router.weight") for name in rows[0]["names"])
        assert covered(rows) == {name for name, _ in parameter_shapes(spec.model)}
        assert len({round(row["loss"], 6) for row in rows}) == 1


def ep_and_reshard_rank(*, rank: int, world_size: int, spec_dicts: list[dict], root: str,
                        pairs: list) -> tuple[list, list]:
    """One spawn for both 2-rank checks: parity, then checkpoints across ep degrees."""
    from tests.distributed.test_layout_checkpoint import reshard_rank

    return (parity_rank(rank=rank, world_size=world_size, spec_dicts=spec_dicts),
            reshard_rank(rank=rank, world_size=world_size, root=root, pairs=pairs))


def test_ep2_matches_one_process_and_its_checkpoints_reshard_to_ep1(tmp_path):
    """Parity of ep=2; then a checkpoint saved under ep=2 loads (by name, DCP resharding the
    expert DTensors and their AdamW moments) under ep=1 and the reverse, refused without
    allow_reshard, and the next step equals the saving layout's."""
    specs = [cpu_spec(*BASE, "cluster.procs_per_node=2", "parallel.name=ep2", "parallel=ep"),
             cpu_spec(*SHIPPED, "cluster.procs_per_node=2", "parallel.name=ep2_tiny_moe",
                      "parallel=ep", "model.moe.aux_loss_coef=0"),
             # ops policy over blocks holding the experts' own FSDP unit (its hooks' profiler
             # markers once failed backward: parallel/recompute.py `selective_contexts`)
             cpu_spec(*SHIPPED, "cluster.procs_per_node=2", "parallel.name=ep2_selective",
                      "parallel=ep", "model.moe.aux_loss_coef=0", "recompute=selective"),
             cpu_spec(*BASE, "cluster.procs_per_node=2", "parallel.name=ep2_cp2", "parallel=ep",
                      "parallel.dp_shard=1", "parallel.cp=2")]  # ep borrows the cp ranks
    ckpt = [cpu_spec(*SHIPPED, "cluster.procs_per_node=2", "training.global_batch_size=8",
                     "training.grad_accum_steps=-1", *extra)
            for extra in (["parallel=ep"], ["parallel=zero3"])]
    pairs = [(spec_to_dict(ckpt[0]), spec_to_dict(ckpt[1])),
             (spec_to_dict(ckpt[1]), spec_to_dict(ckpt[0]))]
    (tmp_path / "ckpt").mkdir()
    results = run_on_ranks(ep_and_reshard_rank, world_size=2, workdir=tmp_path, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs],
                                   "root": str(tmp_path / "ckpt"), "pairs": pairs})
    parity, reshard = zip(*results)
    _check(specs, list(parity))
    every = {name for rows in reshard for row in rows for name in row["names"]}
    assert any(name.endswith("moe.experts.w1") for name in every)
    assert [row["pair"] for row in reshard[0]] == [("ep", "zero3"), ("zero3", "ep")]


def test_ep2_with_zero3_with_tp_and_with_pp_match_one_process(tmp_path):
    _run(tmp_path, FOUR_RANKS, 4, cpu_spec(*SHIPPED, "cluster.procs_per_node=4",
                                           "parallel.name=ep2_pp2", *PIPELINED))
