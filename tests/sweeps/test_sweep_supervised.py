"""A supervised local sweep, with real processes: SIGKILL of `meshrun sweep --parallel 2` when
two points have finished and two are training. Every point process, torchrun and rank goes with
it (within KILL_BOUND_S); `sweep status` says the two are stopped (not running, not failed);
two `sweep retry` started together: one is refused (exit 2, naming the other's pid and host), the other
continues the two in their own run dirs from their checkpoints; in the end each point trained
each step exactly once: one run dir per point, and its metrics.jsonl holds one train row per
step, the raw file as well as the history that readers see (no step ran twice)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from functools import partial
from pathlib import Path

import pytest

from tests.support.meshrun_cli import meshrun as run_meshrun, start_meshrun
from tests.support.processes import descendants, pid_alive, survivors, wait_for

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
STEPS = 200
TINY = ["model=tiny", f"training.steps={STEPS}", "training.seq_len=32", "training.eval_every=0",
        "schedule.warmup_steps=1", "parallel=single", "checkpoint.every_steps=50",
        "logging.wandb_mode=disabled", "optim.lr=1e-3,2e-3,3e-3,4e-3"]
KILL_BOUND_S = 30
"""Every process of a killed runner's points is gone within this (torchrun's grace for its ranks
to stop; here they take about a second: one step, one tiny checkpoint)."""
meshrun = partial(run_meshrun, timeout=300, stdin=subprocess.DEVNULL, columns=200)


def train_steps(run_dir: Path) -> list[int]:
    """Every train row's step in the raw metrics.jsonl, in file order (complete lines only)."""
    text = (run_dir / "metrics.jsonl").read_text() if (run_dir / "metrics.jsonl").exists() else ""
    rows = [json.loads(line) for line in text.splitlines()[:-1 if text and not
                                                          text.endswith("\n") else None] if line]
    return [r["step"] for r in rows if r.get("kind") == "train"]


def points(sweep_dir: Path) -> list[dict]:
    path = sweep_dir / "points.json"
    return json.loads(path.read_text())["points"] if path.exists() else []


def two_done_two_training(sweep_dir: Path) -> bool:
    records = points(sweep_dir)
    if len(records) < 4 or not all(r.get("run_dir") for r in records):
        return False
    done = [(sweep_dir / r["run_dir"] / "summary.json").exists() for r in records]
    steps = [train_steps(sweep_dir / r["run_dir"]) for r in records]
    return done[:2] == [True, True] and all(3 <= len(s) < STEPS - 40 for s in steps[2:])


def sweep_status(sweep_dir: Path) -> dict:
    proc = meshrun("sweep", "status", str(sweep_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """The sweep, SIGKILLed with points 0-1 finished and 2-3 training; then all its processes
    gone. Yields the sweep dir, the seconds until the last of its processes went, their pids,
    and each point's run dir at the kill."""
    sweep_dir = tmp_path_factory.mktemp("supervised") / "sweep"
    runner = start_meshrun("sweep", "--yes", "--parallel", "2", "--dir", str(sweep_dir), *TINY,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: two_done_two_training(sweep_dir) or runner.poll() is not None, 240,
                 "two points finished and two training")
        assert runner.poll() is None, "the sweep ended before it could be killed"
        below = descendants(runner.pid)
        os.kill(runner.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        runner.wait()
        wait_for(lambda: not any(pid_alive(p) for p in below), KILL_BOUND_S,
                 f"the point processes of the killed runner to end: {survivors(str(sweep_dir))}")
        gone_s = time.monotonic() - killed_at
        yield sweep_dir, gone_s, below, {r["index"]: r["run_dir"] for r in points(sweep_dir)}
    finally:
        if runner.poll() is None:
            runner.kill()


def test_the_points_die_with_their_runner(killed):
    sweep_dir, gone_s, below, _ = killed
    assert len(below) >= 6  # 2 x (point process, torchrun, rank)
    assert gone_s < KILL_BOUND_S
    assert survivors(str(sweep_dir)) == []


def test_status_says_the_interrupted_points_stopped(killed):
    sweep_dir, *_ = killed
    status = sweep_status(sweep_dir)
    assert [str(r["state"]) for r in status["points"]] == ["completed", "completed", "stopped",
                                                           "stopped"]
    assert all(3 <= r["step"] < STEPS for r in status["points"][2:])
    table = meshrun("sweep", "status", str(sweep_dir))
    assert "4 points: 2 stopped, 2 completed" in table.stdout
    assert "continue the stopped points" in table.stdout


@pytest.fixture(scope="module")
def retried(killed):
    """Two `sweep retry` on the killed sweep, started together: the sweep dir and
    (exit status, output, pid) of the one that ran, then of the one that was refused."""
    sweep_dir, *_ = killed
    both = [start_meshrun("sweep", "retry", str(sweep_dir), "--yes", "--parallel", "2",
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        outputs = ["".join(proc.communicate(timeout=300)) for proc in both]
        ended = [(proc.returncode, out, proc.pid) for proc, out in zip(both, outputs)]
    finally:
        for proc in both:
            if proc.poll() is None:
                proc.kill()
    ran, refused = sorted(ended, key=lambda result: result[0] == 2)
    return sweep_dir, ran, refused


def test_a_second_retry_is_refused_naming_the_first(retried):
    _, (ran_code, ran_output, ran_pid), (code, output, _) = retried
    assert (ran_code, code) == (0, 2), ran_output + output
    assert "is in use by a running sweep" in output
    assert f"pid {ran_pid} on {socket.gethostname()}" in output
    assert "Traceback" not in output


def test_retry_continues_the_interrupted_points_only(retried, killed):
    sweep_dir, (code, output, _), _ = retried
    _, _, _, run_dirs = killed
    assert code == 0, output
    assert "(skipping 2 completed)" in output
    assert output.count("resuming from its checkpoint") == 2
    records = points(sweep_dir)
    assert [len(r["attempts"]) for r in records] == [1, 1, 2, 2]
    assert {r["index"]: r["run_dir"] for r in records} == run_dirs  # no second run dir
    assert len(list((sweep_dir / "runs").iterdir())) == 4
    assert [str(r["state"]) for r in sweep_status(sweep_dir)["points"]] == ["completed"] * 4


def test_each_point_trained_each_step_exactly_once(retried):
    sweep_dir, *_ = retried
    for record in points(sweep_dir):
        assert train_steps(sweep_dir / record["run_dir"]) == list(range(1, STEPS + 1)), \
            record["name"]
