"""Every loop path's first 5 training losses equal the single-process run's.

Same seed, same global batch (8 sequences of 32 tokens), fp32 on CPU; relative 1e-4. Each run
goes through the loop's whole path: build_parallel_model -> train, eval, checkpoint, gathered
safetensors export, summary. zero3 is a real `meshrun run` launch (compose -> resolve -> run dir
-> torchrun -> preflight -> `python -m training`), and so is the 8-rank pp x dp x tp run that
continues from its checkpoint; the other layouts and the one-process references train the same
run dirs on spawned gloo ranks, one spawn per world size (tests/support/loop_runs.py), since a
launch each would add only its start-up (~10 s here).

Which layouts run here: the loop itself branches only on what a layout's axes do to it (a
pipeline reports the loss from its last stage and exports stage by stage; dp picks each rank's
data), so every one-axis layout of 2 ranks runs its 5 steps here, and the combinations run as
the 8-rank pp x dp x tp continuation below. The 4- and 8-rank combinations' numbers (one update:
the loss, every gradient and every parameter against one process) are proven in
test_layout_parity.py, at the cheaper level of one spawned step.
Runs go one at a time: gloo on 2 cores with 12 processes at once once segfaulted inside a
reduce-scatter.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.spawn import run_on_ranks
from tests.support.meshrun_cli import meshrun
from tests.support.run_outputs import only_run_dir, train_losses
from tests.support.loop_runs import prepare_run_dir, train_run_dirs
from tests.support.specs import cpu_spec

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]

COMMON = ["model=tiny", "model.n_layers=4", "data=synthetic", "training.steps=5",
          "training.seq_len=32", "training.global_batch_size=8", "training.micro_batch_size=2",
          "training.grad_accum_steps=-1", "training.eval_every=0", "checkpoint.every_steps=0",
          "schedule=constant", "schedule.warmup_steps=2", "logging=disabled",
          "cluster.preflight_max_mib=1",  # the join and all-reduce checks, a short table
          "training.cpu_peak_flops=1e11"]  # no MFU checked here: skip timing the CPU peak
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
}
LAUNCHED = ("zero3",)
"""Layouts run through `meshrun run`; zero3's checkpoint is also the source of the cross-layout
continuation below."""
REFERENCES = {"single": ["parallel=single"], "straight": ["training.steps=7", "parallel=single"]}
"""One-process runs, trained in one spawn: the 5-step reference of every layout and the 7-step
straight run the continuation is compared with."""


def _launch(root: Path, name: str, procs: int, overrides: list[str]) -> Path:
    result = meshrun("run", *COMMON, *overrides, f"cluster.procs_per_node={procs}",
                     f"runs_dir={root / name}", timeout=400)
    assert result.returncode == 0, f"{name}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return only_run_dir(root / name)


def _spawned(root: Path, runs: dict[str, list[str]], procs: int) -> dict[str, Path]:
    """Train `runs` (name: overrides beyond COMMON, all with `procs` ranks) in one spawn;
    their run dirs by name."""
    run_dirs = {name: prepare_run_dir(cpu_spec(*COMMON, *extra, f"cluster.procs_per_node={procs}",
                                               f"runs_dir={root / name}"))
                for name, extra in runs.items()}
    outcomes = run_on_ranks(train_run_dirs, world_size=procs, workdir=root, timeout_s=400,
                            kwargs={"run_dirs": [str(d) for d in run_dirs.values()]})
    assert all(o == ["finished"] * len(runs) for o in outcomes), outcomes
    return run_dirs


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory) -> dict[str, Path]:
    """Run dir of every layout's 5-step run (and of the one-process references)."""
    root = tmp_path_factory.mktemp("layouts")
    out = _spawned(root, REFERENCES, 1)
    out.update({name: _launch(root, name, *LAYOUTS[name]) for name in LAUNCHED})
    for procs in sorted({procs for procs, _ in LAYOUTS.values()}):
        names = [n for n, (p, _) in LAYOUTS.items() if p == procs and n not in LAUNCHED]
        if names:
            out.update(_spawned(root, {n: LAYOUTS[n][1] for n in names}, procs))
    for name, run_dir in out.items():
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["export_dir"], name  # the gathered weights were exported
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
    straight (constant LR after warmup, so the schedule does not depend on the step count;
    the straight reference trains on one spawned rank, the continuation is a real launch).
    This is also the loop path of the combined axes: the last stage's loss under dp and tp,
    the stage-by-stage export of tp- and dp-sharded weights."""
    result = meshrun("run", *COMMON, "training.steps=7", "parallel=3d",
                     f"checkpoint.load_from={layout_runs['zero3']}", "cluster.procs_per_node=8",
                     f"runs_dir={tmp_path / 'continued'}", timeout=400)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    runs = {"straight": train_losses(layout_runs["straight"]),
            "continued": train_losses(only_run_dir(tmp_path / "continued"))}
    assert sorted(runs["continued"]) == [6, 7]  # a new run: its metrics start after step 5
    summary = json.loads((only_run_dir(tmp_path / "continued") / "summary.json").read_text())
    assert summary["export_dir"]  # pp x dp x tp gathered its weights and exported them
    for step in (6, 7):
        assert runs["continued"][step] == pytest.approx(runs["straight"][step], rel=1e-4)
