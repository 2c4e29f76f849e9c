"""Who owns a sweep dir and its points, told by flocks that live processes hold (no training):
a second runner is refused with the holder's pid and host while the holder lives, and takes
over at once when it was SIGKILLed; a local point is running only while a process holds its run
dir's lock, and stopped (not failed, not running) once that process died with its runner."""
from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys

import pytest
from rich.console import Console

from conf.errors import ConfigError
from conf.run_dir.run_states import RunState
from sweeps.runner_lock import acquire_sweep_lock, sweep_runner
from sweeps.state import SweepState
from sweeps.track import point_status
from tests.support.sweep_dirs import write_run

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
os.write(fd, b'{"pid": %d, "host": "%s"}' % (os.getpid(), sys.argv[2].encode()))
print("held", flush=True)
time.sleep(600)
"""


def hold_lock(path) -> subprocess.Popen:
    """A live process holding `path`'s flock (as a runner or a point's launcher does)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), socket.gethostname()],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def test_one_runner_per_sweep_dir_and_a_killed_one_frees_it(tmp_path):
    holder = hold_lock(tmp_path / "runner.lock")
    try:
        assert sweep_runner(tmp_path)["pid"] == holder.pid
        with pytest.raises(ConfigError) as refused:
            acquire_sweep_lock(tmp_path, action="retry")
        assert f"pid {holder.pid} on {socket.gethostname()}" in str(refused.value)
    finally:
        kill(holder)
    assert sweep_runner(tmp_path) is None  # no pid check: a dead runner holds nothing
    with acquire_sweep_lock(tmp_path) as lock:
        assert sweep_runner(tmp_path)["pid"] == os.getpid()
        assert SweepState(tmp_path, {"points": []}).runner_alive()
        with pytest.raises(ConfigError):  # not even this process twice
            acquire_sweep_lock(tmp_path)
    assert lock.fd == -1 and sweep_runner(tmp_path) is None


def test_a_point_runs_only_while_a_process_holds_its_run_dir(tmp_path):
    run_dir = tmp_path / "runs" / "lr-1e-3"
    write_run(run_dir, overrides=["optim.lr=1e-3"], val_losses=[5.5], steps=7, finished=False)
    record = {"index": 0, "name": "lr-1e-3", "values": {}, "run_dir": "runs/lr-1e-3",
              "attempts": [{"run_dir": "runs/lr-1e-3", "exit_status": None, "error": None}]}
    state = SweepState(tmp_path, {"points": [record]})
    holder = hold_lock(run_dir / "launcher.lock")
    try:
        row = point_status(state, record, runner_alive=False)
        assert (row["state"], row["step"]) == (RunState.running, 7)
    finally:
        kill(holder)
    assert point_status(state, record, runner_alive=False)["state"] == RunState.stopped
    (run_dir / "summary.json").write_text("{}")
    assert point_status(state, record, runner_alive=False)["state"] == RunState.completed


def test_an_interrupted_point_continues_in_its_own_run_dir(tmp_path):
    """Retry of a point whose runner died before its first checkpoint: it starts over in the
    same run dir (a step-0 resume marker hides the lost rows), never in a second run dir. (One
    with a checkpoint resumes: tests/sweeps/test_sweep_supervised.py.)"""
    from conf.run_dir.metrics_rows import read_metrics_rows
    from conf.run_dir.paths import RunDir
    from launcher.backends.choose import backend_for
    from sweeps.expand import Point
    from sweeps.point_process import RESTART, mark_restart
    from sweeps.submit import _prepare_here
    from sweeps.validate import Checked

    run_dir = tmp_path / "runs" / "lr-1e-3"
    write_run(run_dir, overrides=["optim.lr=1e-3"], val_losses=[5.5], steps=7, finished=False)
    record = {"index": 0, "name": "lr-1e-3", "values": {}, "run_dir": "runs/lr-1e-3",
              "attempts": [{"run_dir": "runs/lr-1e-3", "exit_status": None, "error": None}]}
    state = SweepState(tmp_path, {"points": [record]})
    point = Point(index=0, overrides=("optim.lr=1e-3",), values={}, name="lr-1e-3", group="",
                  tags=())
    spec = RunDir(run_dir).read_spec()
    prepared = _prepare_here(state, Checked(point=point, spec=spec),
                             backend_for(spec.cluster), Console(file=io.StringIO()))
    assert (prepared.mode, prepared.run_dir) == (RESTART, run_dir)
    assert [a["run_dir"] for a in state.record(0)["attempts"]] == ["runs/lr-1e-3"] * 2
    mark_restart(run_dir)
    assert [r for r in read_metrics_rows(run_dir / "metrics.jsonl")
            if r.get("kind") == "train"] == []
