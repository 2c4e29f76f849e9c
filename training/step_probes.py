"""What watches chosen steps: a torch.profiler window and CUDA memory snapshots.

`build_step_probes` returns None when this rank watches nothing (profiling off, the rank not
in training.profile_ranks, the window already past): the loop then pays one `is None` test a
step and nothing else — no profiler object exists. Otherwise the loop calls
`probes = probes.after_step(step)` after each step; it returns None once its last step is
behind it, so the steps after the window cost the same as with profiling off.

The profiler is made right before its warmup steps (never earlier) with a schedule over
global step numbers, so the trace's `ProfilerStep#N` is training step N. Traces go to
<run_dir>/profile/ through torch.profiler.tensorboard_trace_handler (rank<R>.<time>.pt.trace.json:
chrome://tracing, https://ui.perfetto.dev, TensorBoard's profiler plugin). Memory snapshots
(CUDA only; resolve() refuses them on CPU) record the allocator's history from the build on,
and dump it after training.memory_snapshot_step and, from an out-of-memory observer, when
an allocation fails.
"""
from __future__ import annotations

import logging
from pathlib import Path

import torch

from conf.run_dir.paths import RunDir
from conf.spec import TrainingSpec

log = logging.getLogger("meshrun.probes")

MEMORY_HISTORY_ENTRIES = 100_000
"""Allocator events kept for a snapshot (torchtitan's choice): enough for several steps."""


def probes_rank(t: TrainingSpec, rank: int) -> bool:
    """This rank traces and snapshots: it is listed in profile_ranks (empty = every rank)."""
    return not t.profile_ranks or rank in t.profile_ranks


def profile_window(t: TrainingSpec) -> tuple[int, int, int] | None:
    """(first warmup step, first traced step, last traced step), or None when profiling is off."""
    if t.profile_steps <= 0:
        return None
    start = t.profile_start_step
    return start - t.profile_warmup_steps, start, start + t.profile_steps - 1


class StepProbes:
    """The profiler window and the memory snapshot step of one rank."""

    def __init__(self, t: TrainingSpec, *, run_dir: Path, rank: int, device: torch.device,
                 done_step: int) -> None:
        self.run_dir, self.rank, self.device = Path(run_dir), rank, device
        window = profile_window(t)
        self.window = window if window is not None and window[2] > done_step else None
        self.profiler = None
        self.snapshot_step = t.memory_snapshot_step if t.memory_snapshot_step > done_step else 0
        if self.window is not None and done_step >= self.window[1]:
            log.warning("step %d: the profile window (steps %d..%d) began before this leg; "
                        "tracing what is left of it", done_step, self.window[1], self.window[2])
        self.after_step(done_step)

    @property
    def idle(self) -> bool:
        return self.window is None and not self.snapshot_step

    def after_step(self, step: int) -> StepProbes | None:
        """Step `step` is done (or the leg starts after it): start, advance or end the
        profiler, dump a due snapshot. Returns self, or None once nothing is left."""
        if self.window is not None:
            self._profile_after(step)
        if self.snapshot_step and step == self.snapshot_step:
            dump_memory_snapshot(self.run_dir, rank=self.rank, label=f"step{step}")
            self.snapshot_step = 0
        return None if self.idle else self

    def _profile_after(self, step: int) -> None:
        warm_from, _, last = self.window
        if self.profiler is None:
            if step + 1 >= warm_from:
                self.profiler = start_profiler(self.window, run_dir=self.run_dir, rank=self.rank,
                                               device=self.device, next_step=step + 1)
            return
        self.profiler.step()  # `step` ends; the schedule saves the trace after `last`
        if step >= last:
            self.close()

    def close(self) -> None:
        """Stop the profiler (the end of the window, or a leg that ends inside it)."""
        if self.profiler is not None:
            self.profiler.stop()
            self.profiler = None
            log.info("profile traces of steps %d..%d written to %s", self.window[1],
                     self.window[2], RunDir(self.run_dir).profile_dir)
        self.window = None


def build_step_probes(t: TrainingSpec, *, run_dir: Path, rank: int, device: torch.device,
                      done_step: int) -> StepProbes | None:
    """This rank's probes, or None (the loop's only cost then). `done_step`: the step the
    leg starts after (0, or a resumed checkpoint's). Starts the allocator's history and the
    out-of-memory dump when a snapshot is asked for."""
    if not probes_rank(t, rank):
        return None
    if device.type == "cuda" and (t.memory_snapshot_step or t.memory_snapshot_on_oom):
        record_memory_history(run_dir, rank=rank, on_oom=t.memory_snapshot_on_oom)
    probes = StepProbes(t, run_dir=run_dir, rank=rank, device=device, done_step=done_step)
    return None if probes.idle else probes


def start_profiler(window: tuple[int, int, int], *, run_dir: Path, rank: int,
                   device: torch.device, next_step: int):
    """A started torch.profiler whose step count is the training step about to run."""
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    folder = RunDir(run_dir).profile_dir
    folder.mkdir(parents=True, exist_ok=True)
    profiler = profile(activities=activities, schedule=window_schedule(window),
                       on_trace_ready=tensorboard_trace_handler(str(folder),
                                                                worker_name=f"rank{rank}"),
                       record_shapes=True, profile_memory=True, with_stack=False)
    # The schedule reads global step numbers: begin one before the step about to run, inactive,
    # then step into it (public attribute; torchtitan sets it the same way on resume).
    profiler.step_num = next_step - 1
    profiler.start()
    profiler.step()
    return profiler


def window_schedule(window: tuple[int, int, int]):
    """torch.profiler's schedule for global step numbers: warmup, then record, save at the last."""
    from torch.profiler import ProfilerAction

    warm_from, start, last = window

    def action(step: int) -> ProfilerAction:
        if warm_from <= step < start:
            return ProfilerAction.WARMUP
        if start <= step < last:
            return ProfilerAction.RECORD
        if step == last:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.NONE

    return action


def record_memory_history(run_dir: Path, *, rank: int, on_oom: bool) -> None:
    """Record the CUDA allocator's history from now on; with `on_oom`, dump it when an
    allocation fails (before the OutOfMemoryError reaches the loop)."""
    torch.cuda.memory._record_memory_history(max_entries=MEMORY_HISTORY_ENTRIES)
    if on_oom:
        def dump_on_oom(device, alloc, device_alloc, device_free) -> None:
            dump_memory_snapshot(run_dir, rank=rank, label="oom")

        torch._C._cuda_attach_out_of_memory_observer(dump_on_oom)


def dump_memory_snapshot(run_dir: Path, *, rank: int, label: str) -> Path:
    folder = RunDir(run_dir).memory_snapshot_dir
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{rank}_{label}.pickle"
    torch.cuda.memory._dump_snapshot(str(path))
    log.warning("CUDA memory snapshot (%s) written to %s: open it at "
                "https://pytorch.org/memory_viz", label, path)
    return path


PROFILE_OPEN = ("open: tensorboard --logdir {folder} (pip install torch-tb-profiler), or load a "
                "file in https://ui.perfetto.dev")
SNAPSHOT_OPEN = "open: drag a file onto https://pytorch.org/memory_viz"


def probe_summary(run_dir: Path) -> dict:
    """summary.json's pointers to the traces and snapshots this run wrote (none: no keys)."""
    found = {}
    for key, folder, pattern, how in (
            ("profile_traces", RunDir(run_dir).profile_dir, "*.pt.trace.json*", PROFILE_OPEN),
            ("memory_snapshots", RunDir(run_dir).memory_snapshot_dir, "*.pickle", SNAPSHOT_OPEN)):
        files = sorted(folder.glob(pattern)) if folder.is_dir() else []
        if files:
            found[key] = (f"{len(files)} file{'s' if len(files) != 1 else ''} in {folder}; "
                          + how.format(folder=folder))
    return found
