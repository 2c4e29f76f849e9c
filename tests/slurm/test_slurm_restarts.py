"""training.max_restarts on the local Slurm cluster, one job: rank 1 of 2 tasks SIGKILLs
itself before step 6 (training/fault_injection.py, test-only), after the checkpoint of step 4;
then, in the restarted leg, every rank SIGKILLs itself before step 7 at once (no rank left to
catch an error: the task processes that keep the ranks notice, training/slurm_keeper.py). Each
time the job is requeued (a failure requeue, apart from preemption requeues), resumes from
step 4, records the restart leg with its job id, and redoes the steps with the same losses, bit
for bit, to the end."""
from __future__ import annotations

import json
import os
import time
from functools import partial
from pathlib import Path

import pytest

from conf.run_dir.paths import RunDir
from conf.run_dir.metrics_rows import parse_metrics_line
from conf.run_dir.restart_legs import RESTART_KEY
from tests.support.meshrun_cli import meshrun as run_meshrun
from tests.support.run_outputs import only_run_dir
from tests.support.slurm_overrides import SLURM, TINY

pytestmark = pytest.mark.slurm
meshrun = partial(run_meshrun, timeout=400)


def test_failed_ranks_requeue_the_job_which_resumes_to_the_same_losses(slurm_cluster, tmp_path):
    once = tmp_path / "killed-once"
    env = {**os.environ, "MESHRUN_TEST_KILL_AT": "1:6,*:7", "MESHRUN_TEST_KILL_ONCE": str(once)}
    result = meshrun("run", *TINY, "training.steps=8", "checkpoint.every_steps=4",
                     "training.max_restarts=2", *SLURM, f"runs_dir={tmp_path / 'runs'}", env=env)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    deadline = time.monotonic() + 300
    while not RunDir(run_dir).summary_file.exists():
        assert time.monotonic() < deadline, "the run did not finish after its restart"
        time.sleep(0.5)
    assert all(Path(f"{once}{r}").exists() for r in ("", ".rank0", ".rank1"))  # faults fired
    (job,) = json.loads(RunDir(run_dir).jobs_file.read_text())
    legs = RunDir(run_dir).read_resumes()
    assert [leg[RESTART_KEY] for leg in legs] == [1, 2]
    assert all(leg["slurm_job_id"] == job["job_id"] for leg in legs)
    assert [leg["after"]["step"] for leg in legs] == [5, 6]
    written = [parse_metrics_line(line) for line in RunDir(run_dir).metrics_file.read_text()
               .splitlines()]
    losses = lambda step: [r["loss"] for r in written  # noqa: E731
                           if r and r.get("kind") == "train" and r["step"] == step]
    assert len(losses(5)) == 3 and len(set(losses(5))) == 1  # every leg's step 5: one loss
    assert len(losses(6)) == 2 and len(set(losses(6))) == 1
    history = [r for r in RunDir(run_dir).read_rows() if r.get("kind") == "train"]
    assert [r["step"] for r in history] == list(range(1, 9))
    events = [r.get("event") for r in RunDir(run_dir).read_rows() if r.get("kind") == "event"]
    assert "requeued" not in events  # a failure requeue is no preemption
