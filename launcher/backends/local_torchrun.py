"""Launch a run dir on this machine: `torchrun --standalone` with one process per rank
(LocalBackend, the launch backend of cluster=local)."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from conf.run_dir.paths import RunDir
from conf.spec import RunSpec
from launcher.backends.interface import LaunchBackend
from launcher.backends.restart_loop import launch_with_restarts
from launcher.backends.process_lifetime import (
    RANK_DIES_WITH_PARENT_ENV, kill_tree, parent_death_preexec,
)
from launcher.views.progress import watch_run
from launcher.backends.run_owner import owner_state
from launcher.backends.run_lock import RunLock, acquire_run_lock, stop_lock_holder
from launcher.backends.warm_torchrun import WarmTorchrun
from launcher.run_dir_writer import render_command
from conf.run_dir.hang_watch import HangWatchdog
from launcher.watchdog import clear_heartbeats, hung_exit

RUN_DIR_PLACEHOLDER = "<run_dir>"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
"""How this Python starts torchrun; its arguments follow (a warm agent takes those alone)."""


def torchrun_command(spec: RunSpec, *, preflight_only: bool = False) -> list[str]:
    """The exact command that starts every rank; RUN_DIR_PLACEHOLDER stands for the run dir."""
    return [*TORCHRUN, "--standalone",
            f"--nnodes={spec.cluster.nodes}", f"--nproc_per_node={spec.cluster.procs_per_node}",
            "-m", "training", RUN_DIR_PLACEHOLDER] + (["--preflight-only"] if preflight_only else [])


def rank_environment(spec: RunSpec) -> dict[str, str]:
    """Environment for the ranks: one share of the CPU cores each, unbuffered logs."""
    env = dict(os.environ)
    if spec.training.device == "cpu":
        threads = max(1, spec.host.cpu_count // spec.cluster.procs_per_node)
        env.setdefault("OMP_NUM_THREADS", str(threads))
    env["PYTHONUNBUFFERED"] = "1"
    env[RANK_DIES_WITH_PARENT_ENV] = "1"
    return env


def launch_local(spec: RunSpec, run_dir: Path, *, show_progress: bool,
                 preflight_only: bool = False, lock: RunLock | None = None,
                 warm: WarmTorchrun | None = None) -> int:
    """Run torchrun for `run_dir`, show progress from metrics.jsonl; return its exit status.

    Holds the run dir's lock (`lock`, or one taken here) and hands it on to torchrun, which
    dies with this process (SIGTERM: its ranks checkpoint and stop; see
    launcher.backends.process_lifetime).
    torchrun is the `warm` agent when one was started and is still alive, else a new process.
    """
    command = [str(run_dir) if part == RUN_DIR_PLACEHOLDER else part
               for part in torchrun_command(spec, preflight_only=preflight_only)]
    log_path = RunDir(run_dir).torchrun_log
    with contextlib.ExitStack() as stack:
        if lock is None:
            lock = stack.enter_context(acquire_run_lock(run_dir, action="run"))
        log = stack.enter_context(open(log_path, "ab"))
        clear_heartbeats(run_dir)
        proc = start_torchrun(command, env=rank_environment(spec), log=log, lock=lock, warm=warm)
        # SIGTERM/SIGHUP to the launcher act like Ctrl-C: the ranks checkpoint and stop,
        # instead of training on detached in their own session.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupt)
        with HangWatchdog(run_dir, world_size=spec.cluster.nodes * spec.cluster.procs_per_node,
                          setting=spec.training.hang_timeout_s,
                          stop_all=lambda: kill_tree(proc.pid)) as watchdog:
            status = watch_run(proc, run_dir=run_dir, spec=spec, show_progress=show_progress)
        return hung_exit(watchdog) if watchdog.report else status


def start_torchrun(command: list[str], *, env: dict[str, str], log, lock: RunLock,
                   warm: WarmTorchrun | None) -> subprocess.Popen:
    """torchrun in its own session, logging to `log`, holding the run dir's lock, dying with
    this process: the warm agent given the command, or a new process."""
    if warm is not None:
        assert command[:len(TORCHRUN)] == TORCHRUN, f"not a torchrun command: {command}"
        proc = warm.launch(command[len(TORCHRUN):], env=env, log_fd=log.fileno(),
                           lock_fd=lock.fd)
        if proc is not None:
            return proc
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, pass_fds=(lock.fd,),
                            preexec_fn=parent_death_preexec())


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt



def print_rank_commands(commands: list[list[str]], run_dir: Path, console: Console, *,
                        title: str) -> None:
    """The dry run's launch section of a torchrun backend: `title`, then each command."""
    console.print(title, markup=False)
    for cmd in commands:
        console.print("  " + render_command(cmd, run_dir=run_dir), markup=False,
                      highlight=False, soft_wrap=True)


class LocalBackend(LaunchBackend):
    """cluster=local: `torchrun --standalone` on this machine, followed to its end."""

    kind = "local"
    where = "on this machine"
    on_this_machine = True
    detached = False
    sweepable = True

    def launch_command(self, spec: RunSpec) -> list[str]:
        return torchrun_command(spec)

    def render(self, spec: RunSpec, run_dir: Path, command: list[str], console: Console) -> None:
        print_rank_commands([command], run_dir, console, title="launch command:")

    def rank_commands(self, spec: RunSpec, run_dir: str) -> list[list[str]]:
        return [[run_dir if part == RUN_DIR_PLACEHOLDER else part
                 for part in torchrun_command(spec)]]

    def launch(self, spec: RunSpec, run_dir: Path, *, console: Console, show_progress: bool,
               wait: bool = False, preflight_only: bool = False, lock: RunLock | None = None,
               warm: WarmTorchrun | None = None) -> int:
        if preflight_only:
            return launch_local(spec, run_dir, show_progress=show_progress,
                                preflight_only=True, lock=lock, warm=warm)
        return launch_with_restarts(
            run_dir, max_restarts=spec.training.max_restarts, lock=lock,
            launch_leg=lambda held, first: launch_local(
                spec, run_dir, show_progress=show_progress, lock=held,
                warm=warm if first else None))

    def stop(self, run_dir: Path) -> str:
        return stop_lock_holder(run_dir)

    def state(self, run_dir: Path, *, scheduler: dict | None = None) -> dict:
        """`failed`, not "running", when no live process owns the run (run_owner.py)."""
        return owner_state(run_dir)
