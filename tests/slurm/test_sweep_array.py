"""A sweep on the local Slurm cluster: its points go as one job array (same resources), each
array task a multi-node run with one Slurm task per rank, and all of them complete."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.meshrun_cli import meshrun
from tests.support.wandb_reader import read_runs

pytestmark = pytest.mark.slurm
TINY = ["model=tiny", "training.seq_len=32", "training.micro_batch_size=4", "training.steps=6",
        "training.eval_every=3", "schedule.warmup_steps=1", "cluster.preflight_max_mib=1"]
SLURM = ["cluster=slurm", "cluster.gpus_per_node=0", "cluster.procs_per_node=1",
         "cluster.nodes=2", "cluster.rdzv_host=127.0.0.1", "cluster.time_limit_min=10",
         "cluster.warning_signal=USR1@30", f"cluster.python={sys.executable}"]
QUIET = dict(timeout=600, stdin=subprocess.DEVNULL, columns=200)  # every `meshrun` here


def logged_sacct(folder: Path) -> tuple[str, Path]:
    """A PATH whose first `sacct` notes its arguments, one call a line, then runs the real one."""
    real, log = shutil.which("sacct"), folder / "sacct-calls.log"
    folder.mkdir(parents=True)
    script = folder / "sacct"
    script.write_text(f'#!/bin/sh\necho "$(date +%s.%N) $*" >> {log}\nexec {real} "$@"\n')
    script.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}", log


def test_a_two_point_sweep_runs_as_one_job_array(slurm_cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    path, sacct_log = logged_sacct(tmp_path / "bin")
    proc = meshrun("sweep", "--yes", "--wait", "--array-parallelism", "2", "--name", "arr",
                   "--dir", str(sweep_dir), *TINY, *SLURM, "optim.lr=1e-3,3e-3",
                   env={**os.environ, "PATH": path}, **QUIET)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "submitted 2 point(s) as array" in proc.stdout
    assert "(2 node(s) x 1 task(s) each, at most 2 at once)" in proc.stdout

    status = json.loads(meshrun("sweep", "status", str(sweep_dir), "--json", **QUIET).stdout)
    assert status["counts"] == {"completed": 2}, status
    job_ids = [row["job_id"] for row in status["points"]]
    array_ids = {job_id.split("_")[0] for job_id in job_ids}
    assert len(array_ids) == 1 and sorted(j.split("_")[1] for j in job_ids) == ["0", "1"]
    sacct = subprocess.run(["sacct", "-j", array_ids.pop(), "-X", "-n", "-P",
                            "--format=JobID,State,NNodes"], capture_output=True, text=True,
                           check=True).stdout.split()
    assert sorted(sacct) == sorted(f"{j}|COMPLETED|2" for j in job_ids)
    # --wait asked sacct once per poll for both points' jobs, never job by job
    calls = sacct_log.read_text().splitlines()
    assert calls and all(f"-j {','.join(job_ids)} " in call for call in calls), calls
    for row in status["points"]:
        assert row["step"] == row["steps"] == 6
        run_dir = Path(row["run_dir"])
        report = json.loads((run_dir / "preflight.json").read_text())
        assert report["world_size"] == 2  # one rank on each of the two nodes
        assert read_runs(run_dir).group == "arr"
    # a retry never starts a finished point: no job, no run dir, its attempt alone
    retried = meshrun("sweep", "retry", str(sweep_dir), "--yes", **QUIET)
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "(skipping 2 completed)" in retried.stdout and "nothing to run" in retried.stdout
    assert len(list((sweep_dir / "runs").iterdir())) == 2
    points = json.loads((sweep_dir / "points.json").read_text())["points"]
    assert [len(p["attempts"]) for p in points] == [1, 1]
