"""meshrun on a real Slurm cluster started on this machine (two slurmd nodes, accounting on).

One task per rank through submitit; MASTER_ADDR is overridden to 127.0.0.1 because the test
nodes' names (n1, n2) do not resolve.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from tests.support.meshrun_cli import meshrun as run_meshrun
from tests.support.run_outputs import only_run_dir
from tests.support.slurm_overrides import SLURM, TINY
from tests.support.wandb_reader import read_runs

pytestmark = pytest.mark.slurm
meshrun = partial(run_meshrun, timeout=400)  # a Slurm job queues, starts and is polled


def rows(run_dir: Path, kind: str) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in lines if r.get("kind") == kind]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in rows(run_dir, "train")}


def status(run_dir: Path) -> dict:
    result = meshrun("status", str(run_dir), "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def wait_until(predicate, *, timeout_s: float, what: str, every_s: float = 0.2) -> None:
    """Poll `predicate` every `every_s` (a file check: 0.2 s; a `meshrun status` call, which
    starts an interpreter, every 1 s) until it holds or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every_s)


@pytest.fixture(scope="module")
def launches(slurm_cluster, tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Three launches started together (a Slurm job spends much of its time queued, starting
    and polled): "slurm", a 2-node x 2-rank job with awkward characters in its name; "local",
    the same spec as a local 4-process torchrun; "one_node", a 1-node job of 6 steps. Each
    name: (the `meshrun run` result, its runs_dir)."""
    root = tmp_path_factory.mktemp("slurm-runs")
    name = "name='a b \"c\" $HOME; echo x\nnext line'"
    spec = [*TINY, "training.steps=12", name]
    argv = {"slurm": ["run", "--wait", *spec, *SLURM, "cluster.nodes=2"],
            "local": ["run", *spec, "cluster.procs_per_node=4"],
            "one_node": ["run", "--wait", *TINY, "training.steps=6", *SLURM, "cluster.nodes=1"]}
    with ThreadPoolExecutor(len(argv)) as pool:
        started = {key: pool.submit(meshrun, *args, f"runs_dir={root / key}")
                   for key, args in argv.items()}
        return {key: (future.result(), root / key) for key, future in started.items()}


@pytest.fixture(scope="module")
def two_runs(launches):
    """The run dirs of the 2-node Slurm job and of its local 4-process twin."""
    for key in ("slurm", "local"):
        result, _ = launches[key]
        assert result.returncode == 0, result.stdout + result.stderr
    return only_run_dir(launches["slurm"][1]), only_run_dir(launches["local"][1])


def test_two_node_job_matches_a_local_four_process_run(two_runs):
    slurm_dir, local_dir = two_runs
    assert sorted(losses(slurm_dir)) == list(range(1, 13))
    assert losses(slurm_dir) == pytest.approx(losses(local_dir), rel=1e-6, abs=0)
    report = json.loads((slurm_dir / "preflight.json").read_text())
    assert report["world_size"] == 4 and report["all_reduce_check"]["passed"]
    assert status(slurm_dir)["state"] == "completed"
    assert status(slurm_dir)["scheduler_state"] == "COMPLETED"


def test_awkward_overrides_reach_the_ranks_exactly(two_runs):
    slurm_dir, _ = two_runs
    expected = 'a b "c" $HOME; echo x\nnext line'
    assert json.loads((slurm_dir / "spec.json").read_text())["name"] == expected
    assert read_runs(slurm_dir).user_config()["name"] == expected


def test_one_node_job_runs_to_completion(launches):
    result, runs_dir = launches["one_node"]
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = only_run_dir(runs_dir)
    assert sorted(losses(run_dir)) == list(range(1, 7))
    (job,) = json.loads((run_dir / "slurm" / "jobs.json").read_text())
    assert Path(job["stdout"]).exists()


def test_warning_signal_checkpoints_requeues_and_resumes_one_wandb_run(slurm_cluster, tmp_path):
    steps = 20  # the signal comes after step 5: 15 steps of margin before the end
    result = meshrun("run", *TINY, f"training.steps={steps}", "checkpoint.every_steps=100",
                     *SLURM, "cluster.nodes=2", f"runs_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    (job,) = json.loads((run_dir / "slurm" / "jobs.json").read_text())
    wait_until(lambda: len(losses(run_dir)) >= 5, timeout_s=180, what="step 5")
    subprocess.run(["scancel", "--signal=USR1", job["job_id"]], check=True)
    wait_until(lambda: (run_dir / "summary.json").exists(), timeout_s=300, what="completion")
    events = rows(run_dir, "event")
    assert [e["event"] for e in events] == ["requeued", "finished"], events
    stopped_at = events[0]["step"]
    assert 5 <= stopped_at < steps
    assert (run_dir / "checkpoints" / f"step_{stopped_at:08d}").exists() or stopped_at < steps
    assert sorted(losses(run_dir)) == list(range(1, steps + 1))  # no step lost or doubled
    # summary.json comes before W&B has written its file: read that once the job has ended
    wait_until(lambda: status(run_dir)["state"] == "completed", timeout_s=60, what="completed",
               every_s=1)
    record = read_runs(run_dir)
    assert record.run_id == (run_dir / "wandb_id.txt").read_text().strip()
    assert len(record.sources) == 2
    assert status(run_dir)["requeues"] == 1


def test_crashed_job_is_reported_failed_and_resumes_from_its_checkpoint(slurm_cluster, tmp_path):
    result = meshrun("run", *TINY, "training.steps=20", "checkpoint.every_steps=5", *SLURM,
                     "cluster.nodes=2", f"runs_dir={tmp_path}")
    assert result.returncode == 0, result.stderr
    run_dir = only_run_dir(tmp_path)
    wait_until(lambda: (run_dir / "checkpoints" / "step_00000005").exists(), timeout_s=180,
               what="the first checkpoint")
    log = (run_dir / "logs" / "rank3.log").read_text()
    pid = int(re.search(r"pid (\d+)", log).group(1))
    os.kill(pid, signal.SIGKILL)  # a node dies: no warning, no checkpoint
    wait_until(lambda: status(run_dir)["state"] not in ("running", "pending"),
               timeout_s=240, what="the job to fail", every_s=1)
    failed = status(run_dir)
    assert (failed["state"], failed["scheduler_state"]) == ("failed", "FAILED"), failed
    assert "log_tail" in failed and failed["log_tail"].strip()
    resumed = meshrun("resume", "--wait", str(run_dir))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert sorted(losses(run_dir)) == list(range(1, 21))
    assert status(run_dir)["state"] == "completed"
