"""training.max_restarts on cluster=nodes: each node's torchrun runs with --max-restarts and,
after a rank fails anywhere, restarts every node's ranks together (a new c10d rendezvous);
they resume from the newest complete checkpoint as any leg does.

torchrun records nothing and restarts blindly, so rank 0 of each restarted group
(TORCHELASTIC_RESTART_COUNT > 0) first applies the rules of conf/run_dir/restart_legs.py: it
records the restart leg in resumes.jsonl, or, when the run must not restart (the same failure
at the same step twice; no complete checkpoint), says why and leaves at once with an error,
so torchrun's remaining tries end quickly and the run fails saying so.
"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from conf.run_dir.restart_legs import (SAME_FAILURE, failure_of, record_refusal,
                                       record_restart, restart_refusal)

RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"
"""torchrun's count of the restarts of this worker group (0 in the first)."""


def note_elastic_restart(run_dir: Path, *, max_restarts: int) -> None:
    """On rank 0 of a group torchrun restarted: record the leg, or exit 1 saying why not."""
    restarts = int(os.environ.get(RESTART_COUNT_ENV, "0") or 0)
    if restarts == 0 or os.environ.get("RANK", "0") != "0":
        return
    failure = failure_of(run_dir, None)
    reason = restart_refusal(run_dir, failure, max_restarts=max_restarts)
    if reason is None:
        number = record_restart(run_dir, failure, torchrun_restart=str(restarts))
        logging.getLogger("meshrun.restarts").warning(
            "restart %d/%d after %s at step %d (torchrun restart %d)", number, max_restarts,
            failure.cause, failure.step, restarts)
        return
    if reason.startswith(SAME_FAILURE):
        record_refusal(run_dir, failure, reason)
    sys.stderr.write(f"not restarting {run_dir}: {reason}\n")
    sys.exit(1)
