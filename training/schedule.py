"""Learning-rate schedules as a pure, torch-free function of the step (0-based)."""
from __future__ import annotations

import math

from conf.schema import DecayShape, ScheduleKind
from conf.spec import ScheduleSpec


def lr_at(step: int, *, schedule: ScheduleSpec, peak_lr: float, total_steps: int) -> float:
    """LR for optimizer step `step` in [0, total_steps): linear warmup, then the chosen shape."""
    warmup = schedule.warmup_steps
    if step < warmup:
        return peak_lr * (step + 1) / warmup
    floor = schedule.min_lr_ratio
    if schedule.kind == ScheduleKind.constant:
        return peak_lr
    if schedule.kind == ScheduleKind.wsd:
        return peak_lr * _wsd_factor(step, schedule=schedule, total_steps=total_steps)
    progress = _fraction(step - warmup, total_steps - warmup)
    if schedule.kind == ScheduleKind.linear:
        return peak_lr * (1.0 - (1.0 - floor) * progress)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return peak_lr * (floor + (1.0 - floor) * cosine)


def _fraction(done: int, span: int) -> float:
    """done / (span - 1), clipped to [0, 1]: the last step of the span reaches 1."""
    return min(1.0, max(0.0, done / max(1, span - 1)))


def _wsd_factor(step: int, *, schedule: ScheduleSpec, total_steps: int) -> float:
    decay_steps = max(1, round(schedule.decay_fraction * total_steps))
    decay_start = total_steps - decay_steps
    if step < decay_start:
        return 1.0
    q = _fraction(step - decay_start, decay_steps)
    shape = {
        DecayShape.linear: 1.0 - q,
        DecayShape.cosine: 0.5 * (1.0 + math.cos(math.pi * q)),
        DecayShape.one_minus_sqrt: 1.0 - math.sqrt(q),
    }[schedule.decay_shape]
    return schedule.min_lr_ratio + (1.0 - schedule.min_lr_ratio) * shape
