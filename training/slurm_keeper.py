"""Each Slurm task keeps its rank: the task process forks the rank and waits for it.

A rank that dies without a word (SIGKILL from the OOM killer or a person, a segfault) leaves
no exception for a peer to catch when every rank of the job dies at once, and nothing would
requeue the job. Its keeper, the task process Slurm started, outlives it: under
training.max_restarts it requeues the job by the rules a failing rank follows
(training/failure_requeue.py: the first to decide for an attempt wins, the others only leave);
otherwise the task fails with a message naming the rank and the signal.

The keeper ignores the signals Slurm sends the whole step (the warning signal, SIGTERM, the
hang guard's stack signal): every proctrack plugin delivers them to each process of the step,
so the rank receives them itself, checkpoints and answers. A step torn down by Slurm (scancel,
a requeue) kills the keepers too: a keeper waits GRACE_S after its rank's death before it
decides, and does not decide when the hang guard already has (a `hung` event in this leg).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

log = logging.getLogger("meshrun.keeper")

GRACE_S = 1.0
"""How long a keeper waits after its rank died by a signal before requeueing: long enough for
Slurm's own SIGKILL of the whole step (cancel, requeue) to reach the keeper first."""
REQUEUED = "requeued"
REPORT_MAX_CHARS = 12_000
"""A report (JSON, at most 4 bytes a character) fits the pipe's buffer (64 KiB), so the rank never blocks writing it and the keeper
reads it after the rank exited: a reader waiting for EOF would wait on any process the rank
forked (they hold the pipe's write end) and outlived it."""


def keep_rank(run_rank: Callable[[], str], *, run_dir: str, rank: int, max_restarts: int,
              step_signals: list[int]) -> str:
    """Run `run_rank` (one rank's training; it returns its outcome) in a child process and
    wait for it: its outcome, REQUEUED when the job went back to the queue, or an error."""
    read_end, write_end = os.pipe()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, step_signals)
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        _be_the_rank(run_rank, write_end)
    os.close(write_end)
    for signum in step_signals:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    _, status = os.waitpid(pid, 0)
    report = _read_report(read_end)
    if report:
        return _answer(report)
    return _after_silent_death(run_dir, rank=rank, status=status, max_restarts=max_restarts)


def _be_the_rank(run_rank: Callable[[], str], write_end: int) -> None:
    """The child: train, write the outcome (or the traceback) for the keeper, exit."""
    from training.preemption import die_with_parent

    die_with_parent()
    try:
        report = {"outcome": run_rank()}
    except BaseException:  # the keeper raises it again, where submitit records it
        report = {"error": traceback.format_exc()[-REPORT_MAX_CHARS:]}
    os.write(write_end, json.dumps(report).encode())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _read_report(read_end: int) -> dict | None:
    os.set_blocking(read_end, False)
    try:
        said = os.read(read_end, 1 << 16)
    except BlockingIOError:
        said = b""
    os.close(read_end)
    return json.loads(said) if said else None


class RankFailed(RuntimeError):
    """The rank this task kept failed, and the job was not requeued after it."""


def _answer(report: dict) -> str:
    if "error" in report:
        raise RankFailed("the rank failed:\n" + report["error"])
    return report["outcome"]


def _after_silent_death(run_dir: str, *, rank: int, status: int, max_restarts: int) -> str:
    """The rank died without an outcome (a signal, or an exit that skipped its report)."""
    from conf.run_dir.heartbeats import hung_in_this_leg
    from training.failure_requeue import requeue_after_failure

    how = (f"killed by {signal.Signals(os.WTERMSIG(status)).name}" if os.WIFSIGNALED(status)
           else f"exited with status {os.WEXITSTATUS(status)} without an outcome")
    time.sleep(GRACE_S)  # a step torn down by Slurm kills this keeper meanwhile
    log.error("rank %d %s", rank, how)
    if not hung_in_this_leg(run_dir) and requeue_after_failure(Path(run_dir),
                                                               max_restarts=max_restarts):
        return REQUEUED
    raise RankFailed(f"rank {rank} {how} (no error of its own: the OOM killer, a kill -9, "
                     f"a crash in native code); see {run_dir}/logs")
