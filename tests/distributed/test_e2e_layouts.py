"""`meshrun run` under every layout gives the single-process losses for the first 5 steps.

Same seed, same global batch (8 sequences of 32 tokens), fp32 on CPU; relative 1e-4. Each run
goes through the whole path: compose -> resolve -> run dir -> torchrun -> build_parallel_model ->
loop (train, eval, checkpoint, gathered safetensors export). Launches run one at a time:
gloo on 2 cores with 12 processes at once once segfaulted inside a reduce-scatter.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.test_e2e_runs import meshrun, only_run_dir, train_losses

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]

COMMON = ["model=tiny", "model.n_layers=4", "data=synthetic", "training.steps=5",
          "training.seq_len=32", "training.global_batch_size=8", "training.micro_batch_size=2",
          "training.grad_accum_steps=-1", "training.eval_every=0", "checkpoint.every_steps=0",
          "schedule=constant", "schedule.warmup_steps=2", "logging=disabled",
          "cluster.preflight_max_mib=1"]  # the join and all-reduce checks, a short table
LAYOUTS = {  # name: (processes, overrides)
    "ddp": (2, ["parallel=ddp"]),
    "zero1": (2, ["parallel=zero1"]),
    "zero2": (2, ["parallel=zero2"]),
    "zero3": (2, ["parallel=zero3"]),
    "tp": (2, ["parallel=tp"]),
    "cp": (2, ["parallel=cp"]),
    "pp_gpipe": (2, ["parallel=pp", "parallel.pp_schedule=gpipe"]),
    "pp_1f1b": (2, ["parallel=pp", "parallel.pp_schedule=1f1b"]),
    "pp_interleaved": (2, ["parallel=pp", "parallel.pp_schedule=interleaved_1f1b",
                           "parallel.pp_virtual_stages=2", "parallel.pp_microbatches=2"]),
    "hsdp": (4, ["parallel=hsdp"]),
    "dp2_tp2": (4, ["parallel=fsdp_tp"]),
    "pp2_dp2": (4, ["parallel=pp", "parallel.pp=2", "parallel.dp_shard=-1", "parallel.zero=3"]),
    "pp2_tp2": (4, ["parallel=pp", "parallel.pp=2", "parallel.tp=2"]),
    "cp2_tp2": (4, ["parallel=cp", "parallel.cp=2", "parallel.tp=2", "parallel.zero=3"]),
    "pp2_dp2_tp2": (8, ["parallel=3d"]),
}


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory) -> dict[str, Path]:
    """Run dir of every layout's 5-step run (and of the single-process reference)."""
    root = tmp_path_factory.mktemp("layouts")

    def launch(name: str, procs: int, overrides: list[str]):
        return meshrun("run", *COMMON, *overrides, f"cluster.procs_per_node={procs}",
                       f"runs_dir={root / name}", timeout=400)

    jobs = {"single": (1, ["parallel=single"]), **LAYOUTS}
    out = {}
    for name, job in jobs.items():
        result = launch(name, *job)
        assert result.returncode == 0, f"{name}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        run_dir = only_run_dir(root / name)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["export_dir"], name  # the gathered weights were exported
        out[name] = run_dir
    return out


@pytest.fixture(scope="module")
def losses(layout_runs) -> dict[str, dict[int, float]]:
    return {name: train_losses(run_dir) for name, run_dir in layout_runs.items()}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_first_five_losses_match_one_process(losses, layout):
    reference, mine = losses["single"], losses[layout]
    assert sorted(mine) == sorted(reference) == [1, 2, 3, 4, 5]
    for step, loss in reference.items():
        assert mine[step] == pytest.approx(loss, rel=1e-4), (layout, step, mine, reference)


def test_new_run_starts_from_another_layouts_checkpoint(layout_runs, tmp_path):
    """checkpoint.load_from: the zero3 run's step-5 checkpoint (weights, AdamW moments, data
    position) continues under pp x dp x tp (8 ranks) exactly as one process running 7 steps
    straight (constant LR after warmup, so the schedule does not depend on the step count)."""
    runs = {}
    for name, procs, extra in (("straight", 1, ["parallel=single"]),
                               ("continued", 8, ["parallel=3d", "checkpoint.load_from="
                                                 f"{layout_runs['zero3']}"])):
        result = meshrun("run", *COMMON, "training.steps=7", *extra,
                         f"cluster.procs_per_node={procs}", f"runs_dir={tmp_path / name}",
                         timeout=400)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        runs[name] = train_losses(only_run_dir(tmp_path / name))
    assert sorted(runs["continued"]) == [6, 7]  # a new run: its metrics start after step 5
    for step in (6, 7):
        assert runs["continued"][step] == pytest.approx(runs["straight"][step], rel=1e-4)
