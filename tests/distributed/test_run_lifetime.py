"""Nothing lost, nothing left behind: one launcher per run dir, and ranks that never outlive
their launcher (SIGKILL, a closed pipe, a double Ctrl-C). Real `meshrun` processes, 2 gloo ranks."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conf.run_dir.paths import RunDir
from conf.run_dir.run_states import RunState, state_from_files
from conf.run_dir.checkpoint_dirs import checkpoint_step
from tests.support.meshrun_cli import REPO, meshrun, start_meshrun
from tests.support.processes import survivors, wait_for
from tests.support.run_outputs import training_started

pytestmark = [pytest.mark.distributed, pytest.mark.e2e]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
LONG = ["model=tiny", "training.steps=100000", "training.seq_len=32", "training.eval_every=0",
        "schedule.warmup_steps=1", "checkpoint.every_steps=100000", "logging=disabled"]


def start(runs: Path, tmp_path: Path, **popen) -> subprocess.Popen:
    popen.setdefault("stdout", open(tmp_path / "out.txt", "w"))
    return start_meshrun("run", *LONG, f"runs_dir={runs}", env=ENV,
                         stderr=open(tmp_path / "err.txt", "w"), **popen)


def assert_nothing_survives(runs: Path, timeout_s: float = 45) -> None:
    wait_for(lambda: not survivors(str(runs)), timeout_s, f"no process of {runs}: "
             + "\n".join(survivors(str(runs))))


def test_sigkilled_launcher_takes_its_ranks_with_it(tmp_path):
    runs = tmp_path / "runs"
    launcher = start(runs, tmp_path)
    try:
        wait_for(lambda: training_started(runs), 180, "the first train step")
        assert len(survivors(str(runs))) >= 4  # launcher, torchrun, 2 ranks
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        assert_nothing_survives(runs)
        # torchrun got SIGTERM from the kernel and passed it on: the ranks saved and stopped
        run_dir = training_started(runs)
        assert state_from_files(run_dir) is RunState.stopped
        step = checkpoint_step(RunDir(run_dir).latest_checkpoint())
        resumed = meshrun("resume", str(run_dir), f"training.steps={step + 2}", env=ENV,
                          timeout=300)
        assert resumed.returncode == 0, resumed.stderr
        assert "taking over the stale lock" in resumed.stderr  # the killed launcher's record
    finally:
        for line in survivors(str(runs)):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


def test_a_closed_output_pipe_stops_the_run_cleanly(tmp_path):
    runs = tmp_path / "runs"
    launcher = start(runs, tmp_path, stdout=subprocess.PIPE)
    try:
        assert launcher.stdout.readline().startswith(b"run dir: ")  # `| head -1`
        wait_for(lambda: training_started(runs), 180, "the first train step")
        launcher.stdout.close()
        assert launcher.wait(timeout=60) == 130
        assert_nothing_survives(runs, timeout_s=10)
        err = (tmp_path / "err.txt").read_text()
        assert "Traceback" not in err and "output closed" in err, err
    finally:
        for line in survivors(str(runs)):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


def test_a_second_ctrl_c_kills_the_ranks_without_a_traceback(tmp_path):
    runs = tmp_path / "runs"
    launcher = start(runs, tmp_path)
    try:
        wait_for(lambda: training_started(runs), 180, "the first train step")
        launcher.send_signal(signal.SIGINT)
        time.sleep(0.3)  # into the graceful stop (torchrun takes longer than this to stop)
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(timeout=15) == 130
        assert_nothing_survives(runs, timeout_s=5)
        err = (tmp_path / "err.txt").read_text()
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
        assert "killing the ranks now" in err
    finally:
        for line in survivors(str(runs)):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


def test_two_concurrent_resumes_one_refused_by_name_no_row_lost(tmp_path):
    runs = tmp_path / "runs"
    small = ["model=tiny", "training.steps=12", "training.seq_len=32", "training.eval_every=0",
             "checkpoint.every_steps=3", "schedule.warmup_steps=1", "logging=disabled"]
    first = meshrun("run", *small, "training.stop_at_step=3", f"runs_dir={runs}", env=ENV,
                    timeout=300)
    assert first.returncode == 0, first.stderr
    (run_dir,) = list(runs.iterdir())
    winner = start_meshrun("resume", str(run_dir), env=ENV, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (run_dir / "launcher.lock").exists()
             and (run_dir / "launcher.lock").read_text(), 120, "the first resume's lock")
    refused = meshrun("resume", str(run_dir), env=ENV, timeout=300)
    assert winner.wait(timeout=300) == 0, winner.stderr.read()
    assert refused.returncode == 2, refused.stderr
    assert f"is in use by meshrun pid {winner.pid}" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if r.get("kind") == "train"]
    assert steps == list(range(1, 13)), steps  # every step once, none lost or doubled
    assert len((run_dir / "resumes.jsonl").read_text().splitlines()) == 1


def rank_pid(runs: Path, rank: int) -> int:
    for line in survivors(str(runs)):
        pid = int(line.split(":")[0])
        if " -m training " in line:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in env:
                return pid
    raise AssertionError(f"no rank {rank} process")


def test_status_names_the_rank_that_was_killed_not_its_peer(tmp_path):
    runs = tmp_path / "runs"
    launcher = start(runs, tmp_path)
    try:
        run_dir = wait_for(lambda: training_started(runs), 180, "the first train step")
        os.kill(rank_pid(runs, 1), signal.SIGKILL)
        assert launcher.wait(timeout=120) not in (0, 130)
        status = meshrun("status", str(run_dir), env=ENV, timeout=120)
        assert "rank 1 failed first (killed by SIGKILL" in status.stdout, status.stdout
        assert "rank1.log" in status.stdout and "Connection" not in status.stdout
        err = (tmp_path / "err.txt").read_text()
        assert "rank 1 failed first" in err, err
    finally:
        for line in survivors(str(runs)):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
