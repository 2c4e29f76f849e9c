"""training.max_restarts on Slurm: a rank of the job failed, so requeue the job (it resumes
from its newest complete checkpoint), counted apart from the preemption requeues that
cluster.max_requeues bounds.

Every rank that fails with an exception (the one that broke, or a peer whose collective lost
it) calls `requeue_after_failure`; under a lock on resumes.jsonl the first of them decides for
the job (conf/run_dir/restart_legs.py: a complete checkpoint, restarts left, not the same
failure at the same step twice), records the restart leg with the job id and Slurm's restart
count, and runs `scontrol requeue`; the others find that leg and only leave. A job whose every
rank was killed at once (no rank left to notice) is not requeued: it fails, as without
max_restarts.
"""
from __future__ import annotations

import dataclasses
import fcntl
import logging
from pathlib import Path

from conf.run_dir.paths import RunDir
from conf.run_dir.restart_legs import (RESTART_KEY, SAME_FAILURE, failure_of, record_refusal,
                                       record_restart, restart_refusal)
from training.preemption import requeue_job, restart_count, slurm_job_id

log = logging.getLogger("meshrun.restarts")


def failure_requeues(run_dir: Path, job_id: str) -> int:
    """How many times job `job_id` was requeued after a failure (not a preemption)."""
    return sum(1 for leg in RunDir(run_dir).read_resumes()
               if RESTART_KEY in leg and leg.get("slurm_job_id") == job_id)


def requeue_after_failure(run_dir: Path, *, max_restarts: int, cause: str = "") -> bool:
    """This rank failed under Slurm (or the hang guard found the job hung: `cause` says so):
    True when the job is (being) requeued after it, so the task should leave quietly; False
    when the failure stands."""
    job_id = slurm_job_id()
    if not job_id or max_restarts <= 0:
        return False
    attempt = str(restart_count())
    rd = RunDir(run_dir)
    with open(rd.resumes_file, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if any(leg.get("slurm_job_id") == job_id and leg.get("slurm_attempt") == attempt
               for leg in rd.read_resumes()):
            return True  # another rank of this attempt requeued the job already
        failure = failure_of(run_dir, None)
        if cause:
            failure = dataclasses.replace(failure, cause=cause)
        reason = restart_refusal(run_dir, failure, max_restarts=max_restarts)
        if reason is not None:
            if reason.startswith(SAME_FAILURE):
                record_refusal(run_dir, failure, reason)
            log.error("not restarting: %s", reason)
            return False
        number = record_restart(run_dir, failure, slurm_job_id=job_id, slurm_attempt=attempt)
    log.warning("restart %d/%d after %s at step %d: requeueing Slurm job %s", number,
                max_restarts, failure.cause, failure.step, job_id)
    requeue_job(job_id)
    return True
