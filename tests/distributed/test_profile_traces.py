"""training.profile_*: the real loop on 2 spawned gloo ranks (one spawn, two run dirs) writes
one torch.profiler trace per rank into <run_dir>/profile/, holding the window's steps only;
summary.json and the end-of-run table point at them; the same run without profiling trains
the same losses and writes no profile folder."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from conf.run_dir.paths import RunDir
from launcher.views.run_summary import print_summary
from tests.support.loop_runs import prepare_run_dir, train_run_dirs
from tests.support.profile_traces import traced_steps
from tests.support.run_outputs import train_losses
from tests.support.spawn import run_on_ranks
from tests.support.specs import synthetic_spec

STEPS = ("training.steps=5", "checkpoint.export_safetensors=false", "checkpoint.every_steps=0",
         "training.eval_every=0")
WINDOW = ("training.profile_steps=2", "training.profile_start_step=3",
          "training.profile_ranks=[]")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("profile")
    dirs = {name: prepare_run_dir(synthetic_spec(*STEPS, f"runs_dir={root / name}", *extra))
            for name, extra in (("traced", WINDOW), ("plain", ()))}
    outcomes = run_on_ranks(train_run_dirs, world_size=2, workdir=root,
                            kwargs={"run_dirs": [str(d) for d in dirs.values()]}, timeout_s=300)
    assert outcomes == [["finished"] * 2] * 2, outcomes
    return dirs


@pytest.mark.distributed
def test_each_rank_traces_the_window_steps_only(runs):
    traces = sorted(p.name.split(".")[0] for p in RunDir(runs["traced"]).profile_dir.iterdir())
    assert traces == ["rank0", "rank1"]
    assert traced_steps(runs["traced"]) == [{3, 4}, {3, 4}]


@pytest.mark.distributed
def test_the_summary_points_at_the_traces_and_training_is_unchanged(runs):
    folder = RunDir(runs["traced"]).profile_dir
    pointer = RunDir(runs["traced"]).read_summary()["profile_traces"]
    assert pointer.startswith(f"2 files in {folder}; open: tensorboard --logdir {folder}")
    out = io.StringIO()
    print_summary(runs["traced"], Console(file=out, width=80))  # one line, never broken
    assert f"profile traces: {pointer}" in out.getvalue().splitlines(), out.getvalue()
    assert train_losses(runs["traced"]) == train_losses(runs["plain"])
    assert not RunDir(runs["plain"]).profile_dir.exists()
    assert "profile_traces" not in RunDir(runs["plain"]).read_summary()
