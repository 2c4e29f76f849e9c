"""The hang rule and the watchdog's decision, in-process on heartbeat files written by hand
(the real SIGSTOP runs: tests/distributed/test_e2e_hang.py)."""
from __future__ import annotations

import json
import time

from conf.run_dir.heartbeats import (
    LONG_PHASE_FLOOR_S, NEVER_STARTED_GRACE_S, STEP_FLOOR_S, collective_timeouts_s,
    hang_timeout_s, heartbeat_file, stale_ranks,
)
from conf.run_dir.hang_watch import HangWatchdog


def test_auto_timeout_scales_with_the_step_time_and_is_longer_for_one_off_phases():
    assert hang_timeout_s(-1, phase="step", step_times_s=[]) == STEP_FLOOR_S
    assert hang_timeout_s(-1, phase="step", step_times_s=[20.0, 30.0, 40.0]) == 300.0
    assert hang_timeout_s(-1, phase="checkpoint_save", step_times_s=[1.0]) == LONG_PHASE_FLOOR_S
    assert hang_timeout_s(-1, phase="export", step_times_s=[20.0]) == 1000.0
    assert hang_timeout_s(7, phase="init", step_times_s=[100.0]) == 7.0
    init_s, train_s = collective_timeouts_s(7, join_timeout_s=300)
    assert init_s == 307 and train_s == 44  # behind the watchdog, far below torch's 30 min


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _beat(run_dir, rank: int, *, beat: int, phase: str = "step", step: int = 3,
          wall: float | None = None) -> None:
    path = heartbeat_file(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"rank": rank, "pid": 0, "host": "elsewhere", "beat": beat,
                                "phase": phase, "step": step,
                                "time": time.time() if wall is None else wall,
                                "collectives": ["loss all_reduce@3"], "step_times_s": [0.1]}))


def test_a_rank_whose_heartbeat_stops_advancing_is_the_one_named(tmp_path):
    clock = Clock()
    dog = HangWatchdog(tmp_path, world_size=2, setting=5, stop_all=lambda: None, clock=clock)
    for t, beats in ((0, (1, 1)), (3, (2, 1)), (5.5, (3, 1))):
        clock.now = t
        _beat(tmp_path, 0, beat=beats[0], step=4)
        _beat(tmp_path, 1, beat=beats[1])
        stalled = dog.check()
    assert stalled == [1]  # rank 1 silent 5.5 s > 5 s; rank 0 advanced at 5.5 s
    clock.now = 11
    assert dog.check() == [0, 1]  # both silent now; rank 1 (behind) is still the culprit


def test_a_rank_without_any_heartbeat_gets_the_start_up_grace(tmp_path):
    clock = Clock()
    dog = HangWatchdog(tmp_path, world_size=2, setting=5, stop_all=lambda: None, clock=clock)
    _beat(tmp_path, 0, beat=1, phase="done")
    clock.now = NEVER_STARTED_GRACE_S - 1
    assert dog.check() == []
    clock.now = NEVER_STARTED_GRACE_S + 1
    assert dog.check() == [1]


def test_an_earlier_legs_heartbeat_counts_as_none(tmp_path):
    clock = Clock()
    _beat(tmp_path, 1, beat=9, phase="done", wall=time.time() - 3600)
    dog = HangWatchdog(tmp_path, world_size=2, setting=5, stop_all=lambda: None, clock=clock)
    _beat(tmp_path, 0, beat=1, phase="done")
    clock.now = NEVER_STARTED_GRACE_S + 1
    assert dog.check() == [1]


def test_status_lists_heartbeats_older_than_their_phase_timeout(tmp_path):
    _beat(tmp_path, 0, beat=1, wall=0.0)
    _beat(tmp_path, 1, beat=1, phase="done", wall=0.0)
    assert [s["rank"] for s in stale_ranks(tmp_path, setting=5, now=6.0)] == [0]
    assert stale_ranks(tmp_path, setting=5, now=4.0) == []


def test_a_stopped_rank_is_the_culprit_even_before_its_own_timeout(tmp_path):
    """Rank 1 SIGSTOPped right after its first heartbeat; rank 0, waiting for it, went silent
    earlier, so only rank 0 is past its timeout: the stopped process is still the one named."""
    import signal
    import socket
    import subprocess

    from conf.run_dir.hang_watch import _culprits

    stopped = subprocess.Popen(["sleep", "60"])
    try:
        stopped.send_signal(signal.SIGSTOP)
        time.sleep(0.2)  # /proc shows state T
        beats = {0: {"pid": 0, "host": "elsewhere", "step": 0},
                 1: {"pid": stopped.pid, "host": socket.gethostname(), "step": 0}}
        assert _culprits([0], beats) == [1]
        assert _culprits([0], {0: beats[0]}) == [0]  # nobody stopped: the stalled rank
    finally:
        stopped.kill()
        stopped.wait()


def test_on_other_hosts_the_rank_that_does_not_answer_is_the_culprit(tmp_path):
    """Both ranks on other hosts, both silent at the same step (rank 0 waits in a collective
    for rank 1): rank 0's faulthandler answers the stack request, rank 1 (stopped) does not;
    the watchdog names rank 1 (the multi-node Slurm case: no /proc to look at)."""
    from conf.run_dir.heartbeats import stacks_file

    (tmp_path / "logs").mkdir()
    for rank in (0, 1):
        stacks_file(tmp_path, rank).write_text("")
        _beat(tmp_path, rank, beat=5, step=6, wall=time.time())
    answer = lambda: stacks_file(tmp_path, 0).write_text("Thread 0x1 (most recent call first)")
    clock = Clock()
    dog = HangWatchdog(tmp_path, world_size=2, setting=5, stop_all=lambda: None, clock=clock,
                       ask_stacks=answer)
    dog.check()
    clock.now = 6
    stalled = dog.check()
    assert stalled == [0, 1]
    dog.fire(stalled)
    assert dog.report.startswith("hang: no progress from rank(s) 1 within"), dog.report
    assert "did not answer the stack request" in dog.report.splitlines()[2], dog.report
