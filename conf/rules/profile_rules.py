"""Rules on the profiler window (training.profile_*) and the CUDA memory snapshots
(training.memory_snapshot_*): every value refused here, before launch, with its fix.

The window: steps profile_start_step - profile_warmup_steps .. profile_start_step +
profile_steps - 1 run under torch.profiler (training/step_probes.py); the traced part must
end by training.steps. Memory snapshots read the CUDA caching allocator: a run on CPU has
none, so asking for one there is refused (as precision=fp8 is) rather than ignored.
"""
from __future__ import annotations

from conf.errors import ProblemList
from conf.schema import DeviceKind, TrainingConfig

AUTO_START_AFTER_WARMUP = 2
"""Auto start = warmup + this: step 1 (one-off allocations, first collectives) is skipped."""


def profile_start_step(t: TrainingConfig) -> int:
    """training.profile_start_step with -1 (auto) filled: warmup + 2, moved earlier (never
    before warmup + 1) when the window would end after the last step."""
    if t.profile_start_step != -1:
        return t.profile_start_step
    warmup, active = max(t.profile_warmup_steps, 0), max(t.profile_steps, 1)
    latest_fitting = t.steps - active + 1
    return max(warmup + 1, min(warmup + AUTO_START_AFTER_WARMUP, latest_fitting))


def check_profile(t: TrainingConfig, *, world_size: int, device: DeviceKind,
                  problems: ProblemList) -> None:
    _check_window(t, problems)
    used = t.profile_steps > 0 or t.memory_snapshot_step > 0 or t.memory_snapshot_on_oom
    if used and world_size > 0:  # (a bad world size is its own problem, named elsewhere)
        _check_ranks(t.profile_ranks, world_size, problems)
    _check_snapshots(t, device, problems)


def _check_window(t: TrainingConfig, problems: ProblemList) -> None:
    if t.profile_steps < 0:
        problems.add("training.profile_steps", t.profile_steps,
                     "must be >= 0 (0 = no profiling)", "e.g. training.profile_steps=3")
    if t.profile_warmup_steps < 0:
        problems.add("training.profile_warmup_steps", t.profile_warmup_steps,
                     "must be >= 0", "e.g. training.profile_warmup_steps=1")
    bad_start = t.profile_start_step == 0 or t.profile_start_step < -1
    if bad_start:
        problems.add("training.profile_start_step", t.profile_start_step,
                     "must be a step >= 1 (steps count from 1), or -1 for auto",
                     "e.g. training.profile_start_step=3, or -1")
    if t.profile_steps <= 0 or t.profile_warmup_steps < 0 or bad_start:
        return
    start = profile_start_step(t)
    last = start + t.profile_steps - 1
    if last > t.steps > 0:
        problems.add("training.profile_start_step", start,
                     f"the window (steps {start}..{last}, training.profile_steps="
                     f"{t.profile_steps}) ends after the last step (training.steps={t.steps})",
                     f"trace at most {max(t.steps - start + 1, 0)} steps from step {start}, or "
                     "start earlier (training.profile_start_step<="
                     f"{max(t.steps - t.profile_steps + 1, 1)})")
    elif start - t.profile_warmup_steps < 1:
        problems.add("training.profile_warmup_steps", t.profile_warmup_steps,
                     f"warmup steps come before the window's first step ({start}); only "
                     f"{start - 1} step(s) do", f"use training.profile_warmup_steps<={start - 1}, "
                     f"or training.profile_start_step>={t.profile_warmup_steps + 1}")


def _check_ranks(ranks: list[int], world_size: int, problems: ProblemList) -> None:
    bad = sorted({r for r in ranks if not 0 <= r < world_size})
    if bad:
        problems.add("training.profile_ranks", list(ranks),
                     f"ranks {bad} do not exist: this run has ranks 0..{world_size - 1}",
                     f"give ranks within 0..{world_size - 1} (e.g. [0]), or [] for every rank")
    if len(set(ranks)) != len(ranks):
        problems.add("training.profile_ranks", list(ranks), "names a rank twice",
                     "list each rank once")


def _check_snapshots(t: TrainingConfig, device: DeviceKind, problems: ProblemList) -> None:
    step = t.memory_snapshot_step
    if step < 0 or step > max(t.steps, 0):
        problems.add("training.memory_snapshot_step", step,
                     f"must be within [0, training.steps={t.steps}] (0 = no snapshot)",
                     "give a step of the run, or 0")
    wanted = [k for k, on in (("training.memory_snapshot_step", step > 0),
                              ("training.memory_snapshot_on_oom", t.memory_snapshot_on_oom))
              if on]
    if wanted and device is not DeviceKind.cuda:
        for key in wanted:
            value = step if key.endswith("_step") else True
            problems.add(key, value, "a memory snapshot reads the CUDA caching allocator, and "
                         "this run is on CPU (no CUDA: nothing to snapshot)",
                         f"drop {key}, or run on a CUDA GPU (training.device=cuda); for CPU "
                         "time and memory use training.profile_steps")
