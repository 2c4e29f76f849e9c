"""A fault for tests only: a rank that SIGKILLs itself at a step, so tests of automatic
restarts (training.max_restarts) fail a rank deterministically, with no timing race.

Nothing happens unless the test sets MESHRUN_TEST_KILL_AT="RANK:STEP" in the launcher's
environment (the ranks inherit it; several faults: comma-separated): rank RANK (`*`: every
rank, at once) kills itself (SIGKILL, leaving no error of its own, as the OOM killer would)
just before training step STEP. With MESHRUN_TEST_KILL_ONCE=<path> it does so only while <path>
(with `*`: <path>.rank<R>, one per rank) does not exist (it creates it first), so a restarted
leg passes; without it, every leg dies at that step. Never set these outside tests.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

KILL_AT_ENV = "MESHRUN_TEST_KILL_AT"
KILL_ONCE_ENV = "MESHRUN_TEST_KILL_ONCE"


def kill_if_asked(rank: int, step: int) -> None:
    """SIGKILL this rank before `step` when the test environment asks for it (see above)."""
    asked = os.environ.get(KILL_AT_ENV)
    faults = (asked or "").split(",")
    if f"{rank}:{step}" in faults:
        once = os.environ.get(KILL_ONCE_ENV)
    elif f"*:{step}" in faults:
        once = os.environ.get(KILL_ONCE_ENV) and f"{os.environ[KILL_ONCE_ENV]}.rank{rank}"
    else:
        return
    if once:
        if Path(once).exists():
            return
        Path(once).touch()
    os.kill(os.getpid(), signal.SIGKILL)
