"""Smoke checks of the local Slurm test cluster: placement, accounting, submitit round trips."""

from __future__ import annotations

import os
import socket
import sys
import time

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


def test_both_nodes_idle(slurm_cluster):
    out = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %t %c").stdout.split("\n")
    assert sorted(line.split()[0] for line in out if line) == ["n1", "n2"]


def test_srun_places_two_ranks_per_node(slurm_cluster):
    out = slurm_cluster.run("srun", "-N2", "-n4", "bash", "-c",
                            "echo $SLURM_PROCID $SLURMD_NODENAME $SLURM_LOCALID").stdout
    placement = {int(r): (node, int(local)) for r, node, local in (line.split() for line in out.splitlines())}
    assert placement == {0: ("n1", 0), 1: ("n1", 1), 2: ("n2", 0), 3: ("n2", 1)}


def test_sacct_shows_finished_job(slurm_cluster):
    out = slurm_cluster.run("sbatch", "--parsable", "-N1", "--wrap", "true").stdout
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
    assert job.state == "COMPLETED" or job.watcher.get_state(job.job_id, mode="force") == "COMPLETED"


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
