"""Nothing lost, nothing silently wrong, end to end (2 gloo ranks through `meshrun`): a
non-finite loss fails the run at once; resumes remember every leg's overrides."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conf.rundir import RunDir, state_from_files
from tests.distributed.test_e2e_runs import meshrun, only_run_dir

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
