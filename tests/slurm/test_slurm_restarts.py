"""training.max_restarts on the local Slurm cluster: rank 1 of a 2-task job SIGKILLs itself
before step 6 (training/fault_injection.py, test-only), after the checkpoint of step 4. A
surviving rank requeues the job (a failure requeue, apart from preemption requeues); it
resumes from step 4, records the restart leg with its job id, finishes, and redoes step 5 with
the same loss, bit for bit."""
from __future__ import annotations

import json
import os
import time
from functools import partial

import pytest

from conf.run_dir.paths import RunDir
from conf.run_dir.metrics_rows import parse_metrics_line
from conf.run_dir.restart_legs import RESTART_KEY
from tests.support.meshrun_cli import meshrun as run_meshrun
from tests.support.run_outputs import only_run_dir
from tests.support.slurm_overrides import SLURM, TINY

pytestmark = pytest.mark.slurm
meshrun = partial(run_meshrun, timeout=400)


def test_failed_rank_requeues_the_job_which_resumes_to_the_same_losses(slurm_cluster, tmp_path):
    env = {**os.environ, "MESHRUN_TEST_KILL_AT": "1:6",
           "MESHRUN_TEST_KILL_ONCE": str(tmp_path / "killed-once")}
    result = meshrun("run", *TINY, "training.steps=8", "checkpoint.every_steps=4",
                     "training.max_restarts=1", *SLURM, f"runs_dir={tmp_path / 'runs'}", env=env)
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path / "runs")
    deadline = time.monotonic() + 300
    while not RunDir(run_dir).summary_file.exists():
        assert time.monotonic() < deadline, "the run did not finish after its restart"
        time.sleep(0.5)
    assert (tmp_path / "killed-once").exists()
    (job,) = json.loads(RunDir(run_dir).jobs_file.read_text())
    (leg,) = RunDir(run_dir).read_resumes()
    assert leg[RESTART_KEY] == 1 and leg["slurm_job_id"] == job["job_id"]
    assert leg["after"]["step"] == 5
    written = [parse_metrics_line(line) for line in RunDir(run_dir).metrics_file.read_text()
               .splitlines()]
    step5 = [r["loss"] for r in written if r and r.get("kind") == "train" and r["step"] == 5]
    assert len(step5) == 2 and step5[0] == step5[1]  # the killed leg's and the restart's
    history = [r for r in RunDir(run_dir).read_rows() if r.get("kind") == "train"]
    assert [r["step"] for r in history] == list(range(1, 9))
    events = [r.get("event") for r in RunDir(run_dir).read_rows() if r.get("kind") == "event"]
    assert "requeued" not in events  # a failure requeue is no preemption
