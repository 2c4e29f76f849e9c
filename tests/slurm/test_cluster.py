"""Smoke checks of the local Slurm test cluster: placement, accounting, submitit round trips."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import submitit

pytestmark = pytest.mark.slurm

# The job process cannot import this test module by pytest's name for it: ship these functions
# by value instead of by reference.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _executor(folder, **params) -> submitit.AutoExecutor:
    ex = submitit.AutoExecutor(folder=folder, cluster="slurm")
    ex.update_parameters(timeout_min=5, slurm_signal_delay_s=30, **params)
    return ex


def job_facts(tag: str) -> dict:
    env = submitit.JobEnvironment()
    return {
        "tag": tag, "job_id": env.job_id, "global_rank": env.global_rank,
        "local_rank": env.local_rank, "node": env.node, "num_tasks": env.num_tasks,
        "num_nodes": env.num_nodes, "hostnames": list(env.hostnames),
        "slurmd_nodename": os.environ.get("SLURMD_NODENAME"), "pid": os.getpid(),
    }


def job_raises(message: str) -> None:
    raise ValueError(message)


def job_dies_without_result() -> None:
    os._exit(3)  # no result pickle: only sacct can tell submitit that the job is over


def job_waits_for_usr1(folder: str) -> dict:
    """Record SIGUSR1 (our handler replaces nothing of submitit's: it binds USR2, TERM, CONT)."""
    rank = submitit.JobEnvironment().global_rank
    got: list[str] = []
    signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signal.Signals(signum).name))
    Path(folder, f"ready{rank}").touch()
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    return {"rank": rank, "got": got}


def job_requeues_itself_once() -> tuple[str | None, str]:
    """First run: `scontrol requeue` our own job and exit on the SIGTERM that follows."""
    restarts = os.environ.get("SLURM_RESTART_COUNT")
    if restarts is None:
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(143))
        subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=True)
        time.sleep(60)  # never reached the end: SIGTERM arrives within milliseconds
    return restarts, os.environ["SLURM_JOB_ID"]


def test_both_nodes_idle(slurm_cluster):
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %t %c").stdout.split("\n")
    assert sorted(line.split()[0] for line in out if line) == ["n1", "n2"]


def test_srun_places_two_ranks_per_node(slurm_cluster):
    out = slurm_cluster.run("srun", "-N2", "-n4", "bash", "-c",
                            "echo $SLURM_PROCID $SLURMD_NODENAME $SLURM_LOCALID").stdout
    placement = {int(r): (node, int(local)) for r, node, local in (line.split() for line in out.splitlines())}
    assert placement == {0: ("n1", 0), 1: ("n1", 1), 2: ("n2", 0), 3: ("n2", 1)}


def test_sacct_shows_finished_job(slurm_cluster):
    out = slurm_cluster.run("sbatch", "--parsable", "-N1", "--output=/dev/null", "--wrap", "true").stdout
    job_id = out.strip().split(";")[0]  # (sbatch --wait would poll slowly: about 10 s here)
    deadline = time.monotonic() + 30
    while True:
        state = slurm_cluster.run("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State").stdout.strip()
        if state == "COMPLETED" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert state == "COMPLETED"


def test_submitit_two_nodes_two_tasks_each(slurm_cluster, tmp_path):
    job = _executor(tmp_path, nodes=2, tasks_per_node=2).submit(job_facts, "hello")
    results = job.results()  # one per task; job.result() asserts on multi-task jobs
    assert [r["global_rank"] for r in results] == [0, 1, 2, 3]
    assert [r["slurmd_nodename"] for r in results] == ["n1", "n1", "n2", "n2"]
    assert [(r["node"], r["local_rank"]) for r in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {r["job_id"] for r in results} == {job.job_id}
    assert all(r["num_tasks"] == 4 and r["num_nodes"] == 2 for r in results)
    assert results[0]["hostnames"] == ["n1", "n2"]
    assert job.task(0).result()["tag"] == "hello"
    # The result files appear before the job ends: sacct may say RUNNING for a moment longer.
    deadline = time.monotonic() + 30
    while job.watcher.get_state(job.job_id, mode="force") != "COMPLETED":
        assert time.monotonic() < deadline, job.watcher.get_state(job.job_id, mode="cache")
        time.sleep(0.5)


def test_submitit_exception_surfaces(slurm_cluster, tmp_path):
    job = _executor(tmp_path).submit(job_raises, "boom from the job")
    t0 = time.monotonic()
    with pytest.raises(submitit.core.utils.FailedJobError, match="boom from the job"):
        job.result()
    assert time.monotonic() - t0 < 60


def test_submitit_job_killed_without_result_surfaces(slurm_cluster, tmp_path):
    job = _executor(tmp_path).submit(job_dies_without_result)
    job._results_timeout_s = 2  # grace for a slow shared filesystem; 15 s by default
    t0 = time.monotonic()
    with pytest.raises(submitit.core.utils.UncompletedJobError, match="has not produced any output"):
        job.result()
    assert time.monotonic() - t0 < 60


def test_cluster_uses_loopback(slurm_cluster):
    # Node names do not resolve: code that turns SLURM_JOB_NODELIST into an address must let
    # tests override it (e.g. MASTER_ADDR=127.0.0.1).
    with pytest.raises(OSError):
        socket.gethostbyname("n1")


def test_scancel_signal_reaches_every_task(slurm_cluster, tmp_path):
    job = _executor(tmp_path / "sub", nodes=2, tasks_per_node=2).submit(job_waits_for_usr1, str(tmp_path))
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("ready*"))) < 4:
        assert time.monotonic() < deadline and not job.done(), "tasks did not start"
        time.sleep(0.1)
    slurm_cluster.run("scancel", "--signal=USR1", job.job_id)  # no --full: the batch shell would die
    assert [r["got"] for r in job.results()] == [["SIGUSR1"]] * 4


def test_requeued_job_reruns_with_same_id(slurm_cluster, tmp_path):
    job = _executor(tmp_path).submit(job_requeues_itself_once)
    restarts, job_id = job.result()  # the original Job object follows the job through the requeue
    assert (restarts, job_id) == ("1", job.job_id)
