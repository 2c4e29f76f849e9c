"""Nothing lost, nothing silently wrong, end to end (2 gloo ranks through `meshrun`): a
non-finite loss fails the run at once; resumes remember every leg's overrides."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conf.run_dir.paths import RunDir
from conf.run_dir.run_states import state_from_files
from tests.support.meshrun_cli import meshrun
from tests.support.run_outputs import only_run_dir
from training.schedule import lr_at

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
TINY = ["model=tiny", "training.seq_len=64", "training.micro_batch_size=8",
        "training.eval_every=0", "logging=offline"]


def test_non_finite_loss_fails_the_run_at_once_and_saves_nothing_after_it(tmp_path):
    result = meshrun("run", *TINY, "training.steps=8", "checkpoint.every_steps=1",
                     "optim.lr=1e30", "schedule.warmup_steps=0", f"runs_dir={tmp_path}")
    assert result.returncode != 0, result.stdout + result.stderr
    run_dir = RunDir(only_run_dir(tmp_path))
    failed = [r for r in run_dir.read_rows() if r.get("event") == "failed"]
    assert len(failed) == 1 and failed[0]["step"] == 2, failed
    assert "step 2: non-finite" in result.stderr and "loss" in result.stderr
    assert not run_dir.export_dir.exists() and not run_dir.summary_file.exists()
    assert run_dir.latest_checkpoint().name == "step_00000001"  # the last finite state
    assert max(r["step"] for r in run_dir.read_rows() if r.get("kind") == "train") == 2
    assert str(state_from_files(run_dir.path)) == "failed"
    status = meshrun("status", str(run_dir.path), "--json")
    shown = json.loads(status.stdout)
    assert shown["state"] == "failed" and "step 2: non-finite" in shown["log_tail"]


def lr_by_step(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in RunDir(run_dir).read_rows() if r.get("kind") == "train"}


def twelve_step_lrs(spec) -> dict[int, float]:
    """{step: LR} an uninterrupted 12-step run of `spec` logs (a row's step is 1-based)."""
    return {step: lr_at(step - 1, schedule=spec.schedule, peak_lr=spec.optim.lr, total_steps=12)
            for step in range(1, 13)}


def test_a_resume_of_a_resume_keeps_the_later_legs_overrides(tmp_path):
    """run steps=8 stop 2; resume steps=12 stop 4; refused resumes change nothing; a plain
    resume then finishes at 12 on the 12-step LR schedule, as one uninterrupted run would:
    every logged LR is `lr_at` of a 12-step run (the loop's one formula; an uninterrupted
    12-step run logs exactly these, so none is launched here)."""
    legs = ["checkpoint.every_steps=2", "schedule.warmup_steps=2"]
    first = meshrun("run", *TINY, *legs, "training.steps=8", "training.stop_at_step=2",
                    f"runs_dir={tmp_path}")
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = only_run_dir(tmp_path)
    second = meshrun("resume", str(run_dir), "training.steps=12", "training.stop_at_step=4")
    assert second.returncode == 0, second.stdout + second.stderr
    assert max(lr_by_step(run_dir)) == 4

    spec_before = (run_dir / "spec.json").read_bytes()
    resumes_before = (run_dir / "resumes.jsonl").read_bytes()
    for bad, says in ((["training.steps=3"], "newest checkpoint is at step 4"),
                      (["training.stop_at_step=3"], "not after the newest checkpoint's step 4"),
                      (["optim.lr=nan"], "optim.lr=nan")):
        refused = meshrun("resume", str(run_dir), *bad)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert says in refused.stderr, refused.stderr
        assert (run_dir / "spec.json").read_bytes() == spec_before
        assert (run_dir / "resumes.jsonl").read_bytes() == resumes_before

    third = meshrun("resume", str(run_dir))
    assert third.returncode == 0, third.stdout + third.stderr
    lrs = lr_by_step(run_dir)
    assert sorted(lrs) == list(range(1, 13))
    assert lrs == twelve_step_lrs(RunDir(run_dir).read_spec())  # exact: the same formula
    status = json.loads(meshrun("status", str(run_dir), "--json").stdout)
    assert [leg["overrides"] for leg in status["legs"][1:]] == [
        ["training.steps=12", "training.stop_at_step=4"], []]
    assert status["state"] == "completed"


def test_skip_step_drops_non_finite_updates_and_trains_on(tmp_path):
    result = meshrun("run", *TINY, "training.steps=4", "optim.lr=1e30", "schedule.warmup_steps=0",
                     "training.nonfinite=skip_step", "checkpoint.export_safetensors=false",
                     f"runs_dir={tmp_path}")
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [r for r in RunDir(only_run_dir(tmp_path)).read_rows() if r.get("kind") == "train"]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert not rows[0].get("nonfinite") and all(r.get("nonfinite") for r in rows[1:])
