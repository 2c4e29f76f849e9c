"""Every layout against one process: after one AdamW update on the same global batch, the
loss, every gradient and every parameter (gathered to full tensors, matched by name) equal
the single-process reference (fp32, atol 5e-6, rtol 1e-4; lr 1e-4 — see test_ddp_parity.py
for why the one-update protocol uses a small LR). Layouts are grouped by world size: one
spawn per world size (each costs seconds here)."""
from __future__ import annotations

import pytest

from conf.run_dir.spec_io import spec_to_dict
from tests.support.layout_parity import parity_rank
from tests.support.spawn import run_on_ranks
from tests.support.specs import cpu_spec
from training.model_builder import build_model

pytestmark = pytest.mark.distributed

# Two micro-batches per step (gradient accumulation) so no_sync / requires_gradient_sync and
# the token weighting across micro-batches are exercised too.
from tests.support.layouts import DP_TP, EIGHT_RANKS, FOUR_RANKS, TWO_RANKS

BASE = ("model=tiny", "model.n_layers=4", "data=synthetic", "training.seq_len=32",
        "optim.lr=1e-4", "training.micro_batch_size=2", "training.grad_accum_steps=2")



def _specs(layouts: dict[str, list[str]], world: int) -> list:
    return [cpu_spec(*BASE, f"cluster.procs_per_node={world}", f"parallel.name={name}", *extra)
            for name, extra in layouts.items()]


def _all_names(spec) -> list[str]:
    import torch

    model = build_model(spec.model, device=torch.device("cpu"), seed=0)
    return sorted(name for name, _ in model.named_parameters())


def _check_reports(results: list[list[dict]], specs: list) -> None:
    """Every rank ran every layout, and each rank compared every parameter of its share."""
    for spec_index, spec in enumerate(specs):
        rows = [rank_rows[spec_index] for rank_rows in results]
        assert {row["layout"] for row in rows} == {spec.parallel.name}
        covered = set().union(*(row["names"] for row in rows))
        assert covered == set(_all_names(spec)), spec.parallel.name
        assert len({round(row["loss"], 6) for row in rows}) == 1  # one loss, agreed by all


def test_two_rank_layouts_match_one_process(tmp_path):
    specs = _specs(TWO_RANKS, 2)
    results = run_on_ranks(parity_rank, world_size=2, workdir=tmp_path, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    _check_reports(results, specs)


def test_four_rank_layouts_match_one_process(tmp_path):
    specs = _specs(FOUR_RANKS, 4)
    results = run_on_ranks(parity_rank, world_size=4, workdir=tmp_path, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    _check_reports(results, specs)


def test_ddp_and_zero1_under_tp_match_one_process(tmp_path):
    """Gradients of DTensor shards averaged over dp (no DistributedDataParallel), ZeRO-1's
    owners stepping and broadcasting their local shards; two micro-batches, so the average
    runs once, after the last one."""
    specs = _specs(DP_TP, 4)
    assert all(s.parallel.uses_ddp and s.parallel.tp == 2 for s in specs)
    assert [s.parallel.zero for s in specs] == [0, 1, 0]
    results = run_on_ranks(parity_rank, world_size=4, workdir=tmp_path, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    _check_reports(results, specs)


def test_eight_rank_layouts_match_one_process(tmp_path):
    specs = _specs(EIGHT_RANKS, 8)
    results = run_on_ranks(parity_rank, world_size=8, workdir=tmp_path, timeout_s=400,
                           kwargs={"spec_dicts": [spec_to_dict(s) for s in specs]})
    _check_reports(results, specs)
