"""optim=muon under every layout against one process: after one update on the same global
batch the loss, every gradient and every parameter (gathered, matched by name) equal the
single-process reference (fp32, the layout parity tests' tolerances and harness,
tests/support/layout_parity.py), and each rank holds the optimizer state the plan says
(one Muon buffer per matrix shard, two AdamW moments for the rest). One spawn per world
size: 2 ranks for ddp, zero1, zero3, tp, pp and cp; 4 ranks for the 2-D layouts (fsdp+tp:
Shard(0) on dp_shard with Shard(0)/Shard(1) on tp; hsdp)."""
from __future__ import annotations

import pytest
import torch

from conf.run_dir.spec_io import spec_to_dict
from tests.support.layout_parity import ATOL, parity_rank, reference_update
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec
from training.model_builder import build_model

pytestmark = pytest.mark.distributed

BASE = ("model=tiny", "data=synthetic", "training.seq_len=32", "optim=muon", "optim.lr=1e-4",
        "training.micro_batch_size=2", "training.grad_accum_steps=2")
TWO = {"ddp": ["parallel=ddp"], "zero1": ["parallel=zero1"], "zero3": ["parallel=zero3"],
       "tp": ["parallel=tp"], "pp": ["parallel=pp"], "cp": ["parallel=cp"]}
FOUR = {"fsdp_tp": ["parallel=fsdp_tp"], "hsdp": ["parallel=hsdp"]}


def _specs(layouts: dict[str, list[str]], world: int) -> list:
    return [cpu_spec(*BASE, f"cluster.procs_per_node={world}", *extra)
            for extra in layouts.values()]


def _check(results: list[list[dict]], specs: list) -> None:
    every = {n for n, _ in build_model(specs[0].model, device=torch.device("cpu"),
                                       seed=0).named_parameters()}
    for index, spec in enumerate(specs):
        rows = [rank_rows[index] for rank_rows in results]
        assert set().union(*(row["names"] for row in rows)) == every, spec.parallel.name
        assert len({round(row["loss"], 6) for row in rows}) == 1


def test_two_rank_layouts_step_muon_like_one_process(tmp_path):
    specs = _specs(TWO, 2)
    results = run_on_ranks(parity_rank, world_size=2, workdir=tmp_path, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    _check(results, specs)


def test_two_dimensional_layouts_step_muon_like_one_process(tmp_path):
    specs = _specs(FOUR, 4)
    results = run_on_ranks(parity_rank, world_size=4, workdir=tmp_path, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    _check(results, specs)


def test_the_parity_step_moves_muon_matrices_far_beyond_the_tolerance():
    """The parity check can fail: at the parity LR one Muon step moves every hidden matrix
    by far more than the tolerance, and differently from AdamW's step."""
    muon = cpu_spec(*BASE, "cluster.procs_per_node=1", "parallel=single")
    adamw = cpu_spec(*[o for o in BASE if o != "optim=muon"], "cluster.procs_per_node=1",
                     "parallel=single")
    start = dict(build_model(muon.model, device=torch.device("cpu"), seed=0).named_parameters())
    _, _, after_muon = reference_update(muon)
    _, _, after_adamw = reference_update(adamw)
    for name, param in after_muon.items():
        if name.startswith("layers.") and param.ndim == 2:
            assert (param - start[name]).abs().max() > 20 * ATOL, name
            assert (param - after_adamw[name]).abs().max() > 10 * ATOL, name
