"""Outputs a user can trust, through `meshrun` on 2 gloo ranks: a run dir removed while
training stops the run with an error (never exit 0, never a recreated dir), and `resume`
redoes an export that a kill left incomplete, where it used to say "the run is complete"."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from conf.run_dir.export_dirs import export_tmp_dir, is_complete_export
from conf.run_dir.paths import RunDir
from tests.support.meshrun_cli import meshrun, start_meshrun
from tests.support.processes import wait_for
from tests.support.run_outputs import only_run_dir, training_started

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
TINY = ["model=tiny", "training.seq_len=32", "training.micro_batch_size=4",
        "training.eval_every=0", "logging=disabled"]


def test_a_run_dir_removed_while_training_stops_the_run_with_an_error(tmp_path):
    runs = tmp_path / "runs"
    proc = start_meshrun("run", *TINY, "training.steps=2000", "checkpoint.every_steps=0",
                         f"runs_dir={runs}", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    try:
        run_dir = wait_for(lambda: training_started(runs), 180, "the first train step")
        # the ranks' heartbeat threads keep writing into it: rmtree can meet a file made
        # after it listed a folder ("Directory not empty"); remove until it is gone
        wait_for(lambda: shutil.rmtree(run_dir, ignore_errors=True) or not run_dir.exists(),
                 30, "the run dir removed")
        said, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode not in (0, None), said
    assert f"run dir {run_dir} was removed while training" in said, said
    assert not run_dir.exists(), sorted(p.name for p in run_dir.rglob("*"))


def test_resume_redoes_an_export_a_kill_left_incomplete(tmp_path):
    runs = tmp_path / "runs"
    first = meshrun("run", *TINY, "training.steps=2", "checkpoint.every_steps=0",
                    f"runs_dir={runs}")
    assert first.returncode == 0, first.stdout + first.stderr
    run_dir = RunDir(only_run_dir(runs))
    refused = meshrun("resume", str(run_dir.path))  # complete: nothing to redo
    assert refused.returncode == 2 and "the run is complete" in refused.stdout + refused.stderr
    # What a kill during the export leaves: a partial export.tmp/ and no summary.json.
    partial = export_tmp_dir(run_dir.export_dir)
    run_dir.export_dir.rename(partial)
    (partial / "config.json").unlink()
    run_dir.summary_file.unlink()
    resumed = meshrun("resume", str(run_dir.path))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert is_complete_export(run_dir.export_dir) and not partial.exists()
    assert run_dir.read_summary()["export_dir"] == str(run_dir.export_dir)
