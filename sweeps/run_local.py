"""Run a sweep's points on this machine: one after another, or several at once (--parallel N)
when they fit (CPU cores, or whole GPUs per point). One point failing never stops the others.

Each point is launched by its launch backend (launcher.backends: torchrun on this machine),
exactly as `meshrun run` would (or resumed as `meshrun resume` would, or restarted in its own
run dir: sweeps.point_process). One at a time, the runner launches it itself, and torchrun dies
with the runner; with --parallel each point runs in a process of its own
(sweeps.point_process) that dies with the runner, its progress lines going to
logs/launcher.log. Either way a SIGKILLed runner leaves no point training: the ranks save a
checkpoint and stop, and `meshrun sweep retry` continues them.

What the sweep shows meanwhile is sweeps.watch.SweepWatch: a live table of the points on a
terminal (each point's own progress then goes to its logs/launcher.log), plain lines elsewhere.
With --parallel N, one line at the start says how many points will run at once, and why fewer
than N when that is so.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from launcher.backends.choose import backend_for
from conf.errors import ConfigError
from conf.spec import HostSpec, RunSpec
from sweeps.point_process import INTERRUPTED, LAUNCH, run_point, start_point_process
from sweeps.state import SweepState
from sweeps.watch import PointProgress, SweepWatch

POLL_S = 0.2
"""How often the runner looks whether a point process has ended."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A point with its run dir made, ready to launch."""

    index: int
    name: str
    spec: RunSpec
    run_dir: Path
    mode: str = LAUNCH
    """sweeps.point_process: launch (a fresh run dir), resume or restart (in its run dir)."""


def run_local(state: SweepState, make_run_dir, todo: list, *, parallel: int, host: HostSpec,
              console: Console, live: bool | None = None) -> dict[int, int]:
    """Run each of `todo` (validated points); `make_run_dir(item) -> Prepared` creates its run
    dir just before it starts. Returns {point index: exit status}. The caller marks the sweep
    dir's runner as alive meanwhile (points.json), so status can tell running from dead.
    `live`: the live table (default: when the console is a terminal and every point keeps
    logging.progress on)."""
    if parallel > 1:
        console.print(concurrency_note(host, parallel=parallel, specs=[i.spec for i in todo]),
                      markup=False, soft_wrap=True)
    if live is None:
        live = console.is_terminal and all(item.spec.logging.progress for item in todo)
    points = [PointProgress(index=item.point.index, name=item.point.name,
                            steps=item.spec.training.steps) for item in todo]
    with SweepWatch(console, points, live=live, title=f"sweep: {state.dir}") as watch:
        if parallel <= 1 or len(todo) <= 1:
            return _sequential(state, make_run_dir, todo, watch)
        return _parallel(state, make_run_dir, todo, parallel=parallel, host=host, watch=watch)


def concurrency_note(host: HostSpec, *, parallel: int, specs: list[RunSpec]) -> str:
    """One line: how many points --parallel N will run at once here, and why not N."""
    if len(specs) <= 1:
        return f"--parallel {parallel}: only {len(specs)} point to run"
    slots = Slots(host, parallel=parallel, sizes=[spec.world_size for spec in specs])
    together = min(parallel, len(specs))
    if slots.serial_reason:
        return f"--parallel {parallel}: running one point at a time: {slots.serial_reason}"
    if slots.fit < together:
        return f"--parallel {parallel}: at most {slots.fit} points at once: {slots.limit_reason}"
    threads = ("" if slots.free_gpus else
               f", OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} (from the environment)"
               if "OMP_NUM_THREADS" in os.environ else
               f", {slots.threads} CPU thread(s) per rank")
    return f"--parallel {parallel}: up to {together} points at once{threads}"


def _sequential(state: SweepState, make_run_dir, todo: list,
                watch: SweepWatch) -> dict[int, int]:
    """One point after another in this process. Each point's torchrun is an agent started
    while the point before it started (launcher.backends.warm_torchrun): its Python and
    `import torch` overlap that point's start-up instead of following its end."""
    results = {}
    agents = WarmAgents([item.spec for item in todo])
    try:
        for n, item in enumerate(todo, 1):
            status = _one_point(state, make_run_dir, item, watch, n=n, total=len(todo),
                                warm=agents.take(n - 1), results=results)
            if status == INTERRUPTED:
                watch.console.print("sweep interrupted: the remaining points were not started",
                                    markup=False)
                break
    finally:
        agents.discard()
    return results


class WarmAgents:
    """The warm torchrun agent of each point in turn: taking point i's starts point i+1's."""

    def __init__(self, specs: list[RunSpec]) -> None:
        self.local = [backend_for(spec.cluster).on_this_machine for spec in specs]
        self.next = self._start(0)

    def _start(self, i: int):
        if i >= len(self.local) or not self.local[i]:
            return None
        from launcher.backends.warm_torchrun import WarmTorchrun

        return WarmTorchrun.start()

    def take(self, i: int):
        """Point i's agent (None for a point not run here); point i+1's starts now."""
        mine, self.next = self.next, self._start(i + 1)
        return mine

    def discard(self) -> None:
        if self.next is not None:
            self.next.discard()
            self.next = None


def _one_point(state: SweepState, make_run_dir, item, watch: SweepWatch, *, n: int, total: int,
               warm, results: dict) -> int:
    prepared = make_run_dir(item)
    watch.started(index=prepared.index, run_dir=prepared.run_dir, n=n, total=total)
    try:
        try:
            if watch.live:  # the table shows the progress; the point's own lines go to its log
                status = run_point_logged(prepared, warm=warm)
            else:
                status = run_point(prepared.mode, prepared.run_dir, console=watch.console,
                                   show_progress=prepared.spec.logging.progress, warm=warm)
        except ConfigError as err:  # e.g. a resume refused: this point only
            watch.console.print(str(err), markup=False, highlight=False, soft_wrap=True)
            status = 2
    finally:
        if warm is not None and not warm.launched:
            warm.discard()
    results[prepared.index] = status
    state.finish_attempt(prepared.index, exit_status=status)
    watch.ended(index=prepared.index, status=status)
    _report(watch, prepared, status)
    return status


def _parallel(state: SweepState, make_run_dir, todo: list, *, parallel: int, host: HostSpec,
              watch: SweepWatch) -> dict[int, int]:
    """Up to `parallel` point processes at once (as the slots allow). Ctrl-C or SIGTERM: each
    running point is asked to stop (its ranks checkpoint) and waited for."""
    console = watch.console
    pool = Slots(host, parallel=parallel, sizes=[item.spec.world_size for item in todo])
    queue, running, results = deque(todo), {}, {}
    started, interrupted = 0, False
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        while queue or running:
            while queue and not interrupted and pool.take(queue[0].spec, busy=len(running)):
                prepared = make_run_dir(queue.popleft())
                env = pool.env_for(prepared.spec)
                started += 1
                watch.started(index=prepared.index, run_dir=prepared.run_dir, n=started,
                              total=len(todo))
                running[prepared.index] = (prepared, env, _start(prepared, env))
            if not running:
                break
            for index in [i for i, (_, _, proc) in running.items() if proc.poll() is not None]:
                prepared, env, proc = running.pop(index)
                pool.give_back(prepared.spec, env)
                status = _ended(state, watch, prepared, proc.returncode)
                results[index] = status
                interrupted = interrupted or status == INTERRUPTED
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        console.print("interrupted: the running points stop after their step (checkpoint)",
                      markup=False)
        statuses = _stop_all([proc for _, _, proc in running.values()])
        for (index, (prepared, _, _)), status in zip(running.items(), statuses):
            results[index] = _ended(state, watch, prepared, status)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return results


def _start(prepared: Prepared, env: dict[str, str]):
    from conf.run_dir.paths import RunDir

    return start_point_process(prepared.mode, prepared.run_dir, env=env,
                               log_path=RunDir(prepared.run_dir).launcher_log)


def _stop_all(procs: list) -> list[int]:
    """SIGTERM each point process (as Ctrl-C: its ranks checkpoint) and wait for them all; a
    second signal to the runner meanwhile kills them and their ranks at once."""
    from launcher.backends.process_lifetime import kill_tree

    def kill_now(signum: int, frame) -> None:
        for proc in procs:
            if proc.returncode is None:
                kill_tree(proc.pid)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, kill_now)
    try:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        return [proc.wait() for proc in procs]
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _ended(state: SweepState, watch: SweepWatch, prepared: Prepared, status: int) -> int:
    status = INTERRUPTED if status in (-signal.SIGTERM, -signal.SIGINT) else status
    state.finish_attempt(prepared.index, exit_status=status)
    watch.ended(index=prepared.index, status=status)
    _report(watch, prepared, status)
    return status


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt


class Slots:
    """Which points may run at once: whole GPUs per point, or CPU cores on a CPU machine."""

    def __init__(self, host: HostSpec, *, parallel: int, sizes: list[int]) -> None:
        self.parallel = parallel
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = visible.split(",") if visible else [str(i) for i in range(host.gpu_count)]
        self.free_gpus = ids[:host.gpu_count] if host.gpu_count else []
        self.cpus = host.cpu_count
        self.free_cpus = host.cpu_count
        together = min(parallel, len(sizes))
        smallest = sorted(sizes)[:together]
        capacity = len(self.free_gpus) or self.cpus
        self.threads = max(1, self.cpus // max(1, sum(smallest)))
        self.serial_reason = ""
        self.limit_reason = ""
        self.fit = max([1] + [k for k in range(1, len(smallest) + 1)
                              if sum(smallest[:k]) <= capacity])
        """How many of the smallest points fit side by side (at least one always runs)."""
        unit = "GPUs" if self.free_gpus else "CPU cores"
        if len(smallest) > 1 and sum(smallest[:2]) > capacity:
            self.serial_reason = (f"two points need {sum(smallest[:2])} of this machine's "
                                  f"{capacity} {unit}")
        elif self.fit < len(smallest):
            self.limit_reason = (f"{self.fit + 1} points need {sum(smallest[:self.fit + 1])} "
                                 f"of this machine's {capacity} {unit}")

    def take(self, spec: RunSpec, *, busy: int) -> bool:
        if busy >= self.parallel:
            return False
        need = spec.world_size
        if spec.training.device == "cuda":
            return len(self.free_gpus) >= need or busy == 0
        if self.free_cpus >= need or busy == 0:
            self.free_cpus -= need
            return True
        return False

    def env_for(self, spec: RunSpec) -> dict[str, str]:
        if spec.training.device == "cuda":
            mine = self.free_gpus[:spec.world_size]
            del self.free_gpus[:spec.world_size]
            return {"CUDA_VISIBLE_DEVICES": ",".join(mine)}
        if "OMP_NUM_THREADS" in os.environ:
            return {}
        return {"OMP_NUM_THREADS": str(self.threads)}  # one share of the cores per rank

    def give_back(self, spec: RunSpec, env: dict[str, str]) -> None:
        if spec.training.device == "cuda":
            self.free_gpus += [g for g in env["CUDA_VISIBLE_DEVICES"].split(",") if g]
        else:
            self.free_cpus += spec.world_size


def run_point_logged(prepared: Prepared, *, warm=None) -> int:
    """Run a point here (under the live table): its own lines go to its logs/launcher.log."""
    from conf.run_dir.paths import RunDir

    with open(RunDir(prepared.run_dir).launcher_log, "a") as log:
        before, sys.stderr = sys.stderr, log
        try:
            return run_point(prepared.mode, prepared.run_dir, console=Console(file=log),
                             show_progress=False, warm=warm)
        except KeyboardInterrupt:
            return INTERRUPTED
        finally:
            sys.stderr = before


def _report(watch: SweepWatch, prepared: Prepared, status: int) -> None:
    """A line when a point ends (failures only under the live table, which shows the rest)."""
    console = watch.console
    if status == 0:
        if not watch.live:
            console.print(f"point {prepared.index} finished", markup=False)
    elif status != INTERRUPTED:
        console.print(f"point {prepared.index} failed (exit status {status}): {_cause(prepared)}"
                      f"\n  see: meshrun status {prepared.run_dir}", markup=False, soft_wrap=True)


def _cause(prepared: Prepared) -> str:
    """The last line of the failing log that names an error (the exception, usually)."""
    from conf.run_dir.failure_diagnosis import failure_tail

    lines = [line.strip() for line in failure_tail(prepared.run_dir).splitlines() if line.strip()]
    named = [line for line in lines if "Error" in line or "error" in line]
    return (named or lines or ["(no log)"])[-1][:300]
