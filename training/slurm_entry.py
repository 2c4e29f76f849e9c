"""What one Slurm task runs: one rank of the run, in a child its task process keeps
(training/slurm_keeper.py: a rank that dies without a word is noticed there).

The launcher pickles `SlurmRankTask(run_dir)` through submitit; every task of the job unpickles
it and calls it. One task per rank (not torchrun inside a task) means Slurm's warning signal
and SIGTERM reach the training process itself (Slurm signals every process of the step), which checkpoints and requeues the job. Torch
is imported only inside the call, so the launcher can build the task without it.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from conf.run_dir.paths import RunDir
from conf.spec import ClusterSpec
from training.slurm_keeper import REQUEUED, keep_rank

PORT_BASE, PORT_SPAN = 20000, 20000


def rendezvous_port(cluster: ClusterSpec, job_id: str) -> int:
    """cluster.rdzv_port, else a port derived from the job id (the same after a requeue)."""
    if cluster.rdzv_port:
        return cluster.rdzv_port
    digits = "".join(ch for ch in job_id if ch.isdigit()) or "0"
    return PORT_BASE + int(digits) % PORT_SPAN


def export_rank_environment(cluster: ClusterSpec) -> None:
    """RANK/WORLD_SIZE/LOCAL_RANK from Slurm, the rendezvous address, and cluster.env."""
    import submitit

    from training.dist import OWN_STORE_ENV

    env = submitit.JobEnvironment()
    host = cluster.rdzv_host or env.hostnames[0]
    os.environ.update({
        "RANK": str(env.global_rank), "WORLD_SIZE": str(env.num_tasks),
        "LOCAL_RANK": str(env.local_rank), "LOCAL_WORLD_SIZE": str(env.num_tasks // env.num_nodes),
        "MASTER_ADDR": host, "MASTER_PORT": str(rendezvous_port(cluster, str(env.job_id))),
        OWN_STORE_ENV: "1",
    })
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus and "OMP_NUM_THREADS" not in cluster.env:
        os.environ["OMP_NUM_THREADS"] = cpus
    os.environ.update(cluster.env)


class SlurmRankTask:
    """The picklable callable submitted to Slurm: train one rank of `run_dir`."""

    def __init__(self, run_dir: str, *, preflight_only: bool = False) -> None:
        self.run_dir = run_dir
        self.preflight_only = preflight_only

    def __call__(self) -> str:
        spec = RunDir(self.run_dir).read_spec()
        export_rank_environment(spec.cluster)
        if self.preflight_only:
            from training.main import run

            return run(Path(self.run_dir), preflight_only=True)
        if os.environ["RANK"] == "0":
            start_hang_guard(self.run_dir, spec)
        outcome = keep_rank(lambda: _train_rank(self.run_dir, spec), run_dir=self.run_dir,
                            rank=int(os.environ["RANK"]),
                            max_restarts=spec.training.max_restarts,
                            step_signals=step_signals(spec.cluster))
        if outcome == REQUEUED:
            # The job is back in the queue and will rerun this task: write no result file.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return outcome


def _train_rank(run_dir: str, spec) -> str:
    """One rank's training (in the keeper's child): its outcome, REQUEUED after a failure
    under training.max_restarts (training/failure_requeue.py)."""
    from training.failure_requeue import requeue_after_failure
    from training.main import run

    try:
        return run(Path(run_dir))
    except Exception:
        if not requeue_after_failure(Path(run_dir), max_restarts=spec.training.max_restarts):
            raise
        return REQUEUED


def step_signals(cluster: ClusterSpec) -> list[int]:
    """The signals Slurm (or the hang guard) sends every process of the step, which the keeper
    leaves to its rank: the warning signal, submitit's, SIGTERM, SIGINT, the stack signal."""
    from conf.run_dir.heartbeats import STACK_SIGNAL

    warning = getattr(signal, "SIG" + cluster.warning_signal.split("@")[0])
    return sorted({warning, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, STACK_SIGNAL})


def start_hang_guard(run_dir: str, spec) -> int:
    """Fork the hang watchdog (conf/run_dir/hang_watch.py) from rank 0's task process (the
    keeper), before torch is imported: a process of its own, so a stopped, stuck or killed
    rank 0 does not stop it. On a
    hang it asks every task of the job for its stacks (`scancel --signal`), writes the report
    and the `hung` event, then cancels the job. It dies with the task (parent-death signal)."""
    from conf.run_dir.hang_watch import HangWatchdog
    from conf.run_dir.heartbeats import STACK_SIGNAL

    job_id = os.environ.get("SLURM_JOB_ID", "")
    scancel = lambda *extra: subprocess.run(["scancel", *extra, job_id],  # noqa: E731
                                            capture_output=True, timeout=60)
    watchdog = HangWatchdog(Path(run_dir), world_size=int(os.environ["WORLD_SIZE"]),
                            setting=spec.training.hang_timeout_s,
                            stop_all=lambda: _stop_hung_job(run_dir, spec, scancel),
                            ask_stacks=lambda: scancel(f"--signal={int(STACK_SIGNAL)}"))
    pid = os.fork()
    if pid:
        return pid
    try:
        _die_with_parent()
        # scancel --signal reaches every process of the step, this one too: ignore it
        signal.signal(STACK_SIGNAL, signal.SIG_IGN)
        watchdog.run()
    except BaseException as err:  # say why the guard is gone, in the run's logs
        with open(RunDir(run_dir).logs_dir / "hang_guard.log", "a") as f:
            f.write(f"hang guard (pid {os.getpid()}) stopped: {err!r}\n")
    finally:
        os._exit(0)


def _stop_hung_job(run_dir: str, spec, scancel) -> None:
    """A hung job is requeued (it resumes from its newest complete checkpoint) while
    training.max_restarts allows, by the rules every restart follows (training/
    failure_requeue.py); else it is cancelled."""
    from conf.run_dir.heartbeats import HUNG_EVENT
    from training.failure_requeue import requeue_after_failure

    hung = [r for r in RunDir(run_dir).read_rows() if r.get("event") == HUNG_EVENT]
    ranks = hung[-1].get("ranks", []) if hung else []
    cause = "hung (stalled rank " + ", ".join(map(str, ranks)) + ")" if ranks else "hung"
    if not requeue_after_failure(Path(run_dir), max_restarts=spec.training.max_restarts,
                                 cause=cause):
        scancel()


def _die_with_parent() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(0)
