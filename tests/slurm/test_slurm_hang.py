"""No silent hang on Slurm: rank 1 of a 2-node job (one rank per node) SIGSTOPped mid-training
is named by the hang guard forked from rank 0's task on the other node (training/
slurm_entry.py; it reads every rank's heartbeat in the shared run dir), the job is cancelled,
the run's state is `hung`, and the last checkpoint is complete. With training.max_restarts the
hung job is requeued instead and finishes."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest

from conf.run_dir.checkpoint_dirs import is_complete_checkpoint
from conf.run_dir.hang_watch import DETECTION_BOUND_S
from conf.run_dir.heartbeats import HANG_REPORT_FILE, read_heartbeats
from conf.run_dir.paths import RunDir
from tests.support.meshrun_cli import meshrun
from tests.support.processes import pid_alive, wait_for
from tests.support.slurm_overrides import SLURM, TINY

pytestmark = pytest.mark.slurm
HANG_S = 8
REQUEUED_HANG_S = 25
"""The requeued-hang test's timeout: an explicit hang_timeout_s bounds every phase, and the
requeued leg's build and checkpoint load took more than 8 s at load 36-40 (two pytest
workers beside other work), which named the second leg a hang too."""
SCANCEL_SLACK_S = 20.0
"""Beyond the guard's bound: a step's age, scancel, and sacct seeing the job end."""
STATUS_EVERY_S = 1.0
"""Between two `meshrun status` polls: each starts an interpreter (about 0.6 s of CPU)."""


def test_a_stopped_rank_on_another_node_is_named_and_the_job_cancelled(slurm_cluster,
                                                                       tmp_path):
    runs = tmp_path / "runs"
    one_per_node = [o for o in SLURM if not o.startswith("cluster.procs_per_node=")]
    args = [*TINY, *one_per_node, "cluster.nodes=2", "cluster.procs_per_node=1", "logging=disabled", f"runs_dir={runs}",
            "training.steps=400", "checkpoint.every_steps=2", "checkpoint.keep_last=1",
            "checkpoint.export_safetensors=false", f"training.hang_timeout_s={HANG_S}"]
    run_dir, beat, stopped_at = _submit_and_stop_rank_1_after_step_5(runs, args)
    try:
        shown = wait_for(lambda: (s := _status(run_dir))["state"] == "hung" and s,
                         HANG_S + DETECTION_BOUND_S + SCANCEL_SLACK_S + 30, "state hung",
                         every_s=STATUS_EVERY_S)
    finally:
        if pid_alive(beat["pid"]):
            os.kill(beat["pid"], signal.SIGCONT)
    named_after = time.monotonic() - stopped_at
    assert named_after < HANG_S + DETECTION_BOUND_S + SCANCEL_SLACK_S, named_after
    assert "rank(s) 1" in shown["hang"], shown
    report = (RunDir(run_dir).logs_dir / HANG_REPORT_FILE).read_text()
    assert "rank 1 [STALLED]" in report and "did not answer the stack request" in report, report
    wait_for(lambda: not pid_alive(beat["pid"]), 60, "the job's processes to be gone")
    assert is_complete_checkpoint(RunDir(run_dir).latest_checkpoint())


def _submit_and_stop_rank_1_after_step_5(runs, args) -> tuple:
    """Submit `meshrun run *args`; once rank 1's heartbeat is past step 5 and a checkpoint
    exists, SIGSTOP rank 1. (run dir, rank 1's heartbeat, time.monotonic() when stopped)."""
    submitted = meshrun("run", *args, timeout=120)
    assert submitted.returncode == 0, submitted.stderr
    run_dir = next(p.parent for p in runs.glob("*/spec.json"))
    beat = wait_for(lambda: (b := read_heartbeats(run_dir).get(1)) and b["step"] >= 5 and
                    RunDir(run_dir).latest_checkpoint() and b, 240, "rank 1 at step 5")
    os.kill(beat["pid"], signal.SIGSTOP)
    return run_dir, beat, time.monotonic()


def _status(run_dir) -> dict:
    out = meshrun("status", str(run_dir), "--json", timeout=60)
    return json.loads(out.stdout) if out.returncode == 0 else {"state": "?"}


def test_a_hung_job_with_restarts_left_is_requeued_and_finishes(slurm_cluster, tmp_path):
    """training.max_restarts on Slurm covers hangs too: the guard requeues the job (a restart
    leg naming the hang) instead of cancelling it, and the run finishes from its checkpoint."""
    runs = tmp_path / "runs"
    args = [*TINY, *SLURM, "cluster.nodes=1", "logging=disabled", f"runs_dir={runs}",
            "training.steps=40", "checkpoint.every_steps=2", "checkpoint.keep_last=1",
            "checkpoint.export_safetensors=false", f"training.hang_timeout_s={REQUEUED_HANG_S}",
            "training.max_restarts=1"]
    run_dir, beat, _ = _submit_and_stop_rank_1_after_step_5(runs, args)
    try:
        wait_for(lambda: _status(run_dir)["state"] == "completed", 300, "the requeued run's end",
                 every_s=STATUS_EVERY_S)
    finally:
        if pid_alive(beat["pid"]):
            os.kill(beat["pid"], signal.SIGCONT)
    legs = [leg for leg in RunDir(run_dir).read_resumes() if "restart" in leg]
    assert len(legs) == 1 and legs[0]["after"]["cause"] == "hung (stalled rank 1)", legs
    steps = [r["step"] for r in RunDir(run_dir).read_rows() if r.get("kind") == "train"]
    assert steps == list(range(1, 41)), steps
