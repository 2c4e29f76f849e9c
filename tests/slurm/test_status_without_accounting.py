"""`meshrun status` of a Slurm run when accounting does not answer: sacct fails as it does
without slurmdbd (here: a `sacct` earlier on PATH that prints sacct's own error and exits 1,
on the real test cluster), and the state comes from squeue instead, saying so."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.support.meshrun_cli import REPO, meshrun
from tests.support.run_outputs import only_run_dir
from tests.support.slurm_overrides import SLURM, TINY

pytestmark = pytest.mark.slurm
FAILING_SACCT = """#!/bin/sh
echo "sacct: error: Problem talking to the database: Connection refused" >&2
exit 1
"""


def _env_without_sacct(folder: Path) -> dict[str, str]:
    folder.mkdir()
    sacct = folder / "sacct"
    sacct.write_text(FAILING_SACCT)
    sacct.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}


def _status(run_dir: Path, env: dict[str, str]) -> dict:
    proc = meshrun("status", str(run_dir), "--json", env=env, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def test_status_falls_back_to_squeue_and_then_to_the_run_dir(slurm_cluster, tmp_path):
    runs = tmp_path / "runs"
    done = meshrun("run", *TINY, *SLURM, "data=synthetic", "training.steps=50",
                   f"runs_dir={runs}", timeout=120)  # no --wait: back once submitted
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = only_run_dir(runs)
    (job,) = json.loads((run_dir / "slurm" / "jobs.json").read_text())
    slurm_cluster.run("scontrol", "hold", job["job_id"], check=False)  # keep it queued
    env = _env_without_sacct(tmp_path / "bin")
    try:
        queued = _status(run_dir, env)
        assert queued["scheduler_state"] in ("PENDING", "RUNNING"), queued
        assert queued["state"] in ("pending", "running")
        assert queued["scheduler_note"].startswith("accounting unavailable (sacct: sacct: "
                                                   "error: Problem talking to the database")
        assert queued["scheduler_note"].endswith("state from squeue")
        table = meshrun("status", str(run_dir), env=env, columns=200, timeout=60)
        assert table.returncode == 0 and "note: accounting unavailable" in table.stdout
    finally:
        slurm_cluster.run("scancel", job["job_id"], check=False)
    deadline = time.monotonic() + 30
    while (ended := _status(run_dir, env))["scheduler_state"] != "CANCELLED":
        assert time.monotonic() < deadline, ended
        time.sleep(0.5)
    assert ended["state"] == "cancelled"
    # Past MinJobAge the controller forgets the job: only the run dir can say how it ended.
    jobs = run_dir / "slurm" / "jobs.json"
    jobs.write_text(json.dumps([{**job, "job_id": "99999999"}]))
    gone = _status(run_dir, env)
    assert gone["scheduler_state"] == "NOT_IN_QUEUE"
    assert gone["state"] == "unknown"  # nothing ran: no summary, no event, no rank log
    assert "squeue no longer lists the job" in gone["scheduler_note"]
