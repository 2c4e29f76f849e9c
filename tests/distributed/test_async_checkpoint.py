"""checkpoint.async_save: the real loop on 2 spawned gloo ranks saves in the background, and
a run continued from an async checkpoint trains exactly as one continued from a sync checkpoint
of the same step. One spawn trains all four run dirs (tests/support/loop_runs.py)."""
from __future__ import annotations

import pytest

from conf.run_dir.checkpoint_dirs import complete_checkpoints, step_dir
from conf.run_dir.checkpoint_verify import checkpoint_problems
from conf.run_dir.paths import RunDir
from tests.support.loop_runs import prepare_run_dir, train_run_dirs
from tests.support.run_outputs import train_losses
from tests.support.spawn import run_on_ranks
from tests.support.specs import synthetic_spec

STEPS = ("training.steps=4", "checkpoint.export_safetensors=false")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("async_ckpt")

    def run_dir(name: str, *overrides: str):
        return prepare_run_dir(synthetic_spec(*STEPS, f"runs_dir={root / name}", *overrides))

    saving = ("checkpoint.every_steps=1", "checkpoint.keep_last=5")
    dirs = {"sync": run_dir("sync", *saving),
            "async": run_dir("async", *saving, "checkpoint.async_save=true")}
    for kind in ("sync", "async"):
        step_2 = step_dir(RunDir(dirs[kind]).checkpoints_dir, step=2)
        dirs[f"from_{kind}"] = run_dir(f"from_{kind}", f"checkpoint.load_from={step_2}",
                                       "checkpoint.every_steps=0")
    outcomes = run_on_ranks(train_run_dirs, world_size=2, workdir=root,
                            kwargs={"run_dirs": [str(d) for d in dirs.values()]}, timeout_s=300)
    assert outcomes == [["finished"] * 4] * 2, outcomes
    return dirs


@pytest.mark.distributed
def test_async_saves_every_step_and_each_checkpoint_verifies(runs):
    for kind in ("sync", "async"):
        found = complete_checkpoints(RunDir(runs[kind]).checkpoints_dir)
        assert [p.name for p in found] == [f"step_{s:08d}" for s in range(1, 5)], found
        assert all(checkpoint_problems(p) == [] for p in found)
    assert RunDir(runs["async"]).read_summary()["last_checkpoint"].endswith("step_00000004")


@pytest.mark.distributed
def test_saving_in_the_background_does_not_change_training(runs):
    assert train_losses(runs["async"]) == train_losses(runs["sync"])


@pytest.mark.distributed
def test_a_run_from_an_async_checkpoint_trains_as_one_from_a_sync_checkpoint(runs):
    from_async, from_sync = train_losses(runs["from_async"]), train_losses(runs["from_sync"])
    assert sorted(from_async) == [3, 4]
    assert from_async == from_sync
