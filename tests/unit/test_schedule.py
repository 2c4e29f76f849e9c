"""LR schedules (training/schedule.py): warmup, the decay shapes, and the final LR."""
from __future__ import annotations

import math

import pytest

from conf.schema import DecayShape, ScheduleKind
from conf.spec import ScheduleSpec
from training.schedule import lr_at

PEAK = 3e-3
STEPS = 200
WARMUP = 20
FLOOR = 0.1


def spec(kind: ScheduleKind, *, warmup: int = WARMUP, floor: float = FLOOR,
         decay_fraction: float = 0.2, shape: DecayShape = DecayShape.linear) -> ScheduleSpec:
    return ScheduleSpec(kind=kind, warmup_steps=warmup, min_lr_ratio=floor,
                        decay_fraction=decay_fraction, decay_shape=shape)


def curve(s: ScheduleSpec, steps: int = STEPS) -> list[float]:
    return [lr_at(i, schedule=s, peak_lr=PEAK, total_steps=steps) for i in range(steps)]


ALL = [
    pytest.param(spec(ScheduleKind.constant), id="constant"),
    pytest.param(spec(ScheduleKind.linear), id="linear"),
    pytest.param(spec(ScheduleKind.cosine), id="cosine"),
    *[pytest.param(spec(ScheduleKind.wsd, shape=shape), id=f"wsd-{shape.value}")
      for shape in DecayShape],
]
DECAYING = [p for p in ALL if p.id != "constant"]


@pytest.mark.parametrize("s", ALL)
def test_warmup_ramps_linearly_to_the_peak(s: ScheduleSpec):
    lrs = curve(s)
    assert lrs[0] == pytest.approx(PEAK / WARMUP)
    steps = [b - a for a, b in zip(lrs[:WARMUP], lrs[1:WARMUP])]
    assert steps == pytest.approx([PEAK / WARMUP] * (WARMUP - 1))
    assert lrs[WARMUP - 1] == pytest.approx(PEAK)
    assert lrs[WARMUP] == pytest.approx(PEAK)  # the first step after warmup is still the peak
    assert max(lrs) == pytest.approx(PEAK)


@pytest.mark.parametrize("s", ALL)
def test_monotone_non_increasing_after_warmup(s: ScheduleSpec):
    after = curve(s)[WARMUP - 1:]
    assert all(b <= a + 1e-15 for a, b in zip(after, after[1:]))


@pytest.mark.parametrize("s", DECAYING)
def test_last_step_reaches_peak_times_min_lr_ratio(s: ScheduleSpec):
    lrs = curve(s)
    assert lrs[-1] == pytest.approx(PEAK * FLOOR)
    assert min(lrs[WARMUP:]) == pytest.approx(PEAK * FLOOR)
    assert lrs[-2] > lrs[-1]


def test_constant_holds_the_peak_and_ignores_min_lr_ratio():
    lrs = curve(spec(ScheduleKind.constant))
    assert lrs[WARMUP:] == pytest.approx([PEAK] * (STEPS - WARMUP))


@pytest.mark.parametrize("kind,mid_factor", [
    (ScheduleKind.linear, FLOOR + (1 - FLOOR) * 0.5),
    (ScheduleKind.cosine, FLOOR + (1 - FLOOR) * 0.5),
])
def test_midpoint_of_the_decay(kind: ScheduleKind, mid_factor: float):
    # 21 steps after a 10-step warmup: progress = (step - 10) / 20, so step 20 is half way.
    s = spec(kind, warmup=10)
    assert lr_at(20, schedule=s, peak_lr=PEAK, total_steps=31) == pytest.approx(PEAK * mid_factor)


def test_cosine_quarter_point():
    s = spec(ScheduleKind.cosine, warmup=0, floor=0.0)
    # progress 0.25 at step 25 of 101: factor 0.5 * (1 + cos(pi/4))
    got = lr_at(25, schedule=s, peak_lr=PEAK, total_steps=101)
    assert got == pytest.approx(PEAK * 0.5 * (1 + math.cos(math.pi / 4)))


def test_no_warmup_starts_at_the_peak():
    for s in (spec(ScheduleKind.cosine, warmup=0), spec(ScheduleKind.wsd, warmup=0)):
        assert lr_at(0, schedule=s, peak_lr=PEAK, total_steps=STEPS) == pytest.approx(PEAK)


@pytest.mark.parametrize("shape", list(DecayShape), ids=lambda s: s.value)
def test_wsd_holds_the_peak_until_the_decay_starts(shape: DecayShape):
    s = spec(ScheduleKind.wsd, shape=shape, decay_fraction=0.25)
    lrs = curve(s)
    decay_start = STEPS - round(0.25 * STEPS)  # 150
    assert lrs[WARMUP - 1:decay_start + 1] == pytest.approx([PEAK] * (decay_start - WARMUP + 2))
    assert lrs[decay_start + 1] < PEAK
    assert lrs[-1] == pytest.approx(PEAK * FLOOR)


def test_wsd_one_minus_sqrt_values():
    # 100 steps, decay over the last 5 (steps 95..99): q = 0, 1/4, 1/2, 3/4, 1.
    s = spec(ScheduleKind.wsd, warmup=10, floor=0.0, decay_fraction=0.05,
             shape=DecayShape.one_minus_sqrt)
    got = [lr_at(i, schedule=s, peak_lr=1.0, total_steps=100) for i in range(94, 100)]
    want = [1.0, 1.0, 0.5, 1 - math.sqrt(0.5), 1 - math.sqrt(0.75), 0.0]
    assert got == pytest.approx(want)
    assert got[3] == pytest.approx(0.292893, abs=1e-6)
    assert got[4] == pytest.approx(0.133975, abs=1e-6)


def test_wsd_one_minus_sqrt_with_floor():
    s = spec(ScheduleKind.wsd, warmup=10, floor=0.2, decay_fraction=0.05,
             shape=DecayShape.one_minus_sqrt)
    assert lr_at(96, schedule=s, peak_lr=1.0, total_steps=100) == pytest.approx(0.2 + 0.8 * 0.5)
    assert lr_at(99, schedule=s, peak_lr=1.0, total_steps=100) == pytest.approx(0.2)


@pytest.mark.parametrize("shape,half", [
    (DecayShape.linear, 0.5),
    (DecayShape.cosine, 0.5),
    (DecayShape.one_minus_sqrt, 1 - math.sqrt(0.5)),
])
def test_wsd_decay_shapes_at_half_way(shape: DecayShape, half: float):
    s = spec(ScheduleKind.wsd, warmup=10, floor=0.0, decay_fraction=0.05, shape=shape)
    assert lr_at(97, schedule=s, peak_lr=1.0, total_steps=100) == pytest.approx(half)


def test_one_minus_sqrt_falls_faster_early_than_linear():
    kw = dict(warmup=10, floor=0.0, decay_fraction=0.2)
    sqrt = curve(spec(ScheduleKind.wsd, shape=DecayShape.one_minus_sqrt, **kw), 100)
    lin = curve(spec(ScheduleKind.wsd, shape=DecayShape.linear, **kw), 100)
    assert all(a <= b + 1e-15 for a, b in zip(sqrt[80:], lin[80:]))
    assert sqrt[85] < lin[85]
