"""MFU's CPU peak (repeated, two sizes, clamped) and the no-MFU-over-100% rule, deterministic:
the matmul timing and the timer are fakes."""
from __future__ import annotations

import itertools
import logging

import pytest
import torch

from parallel.cost.devices import PeakFlops
from parallel.cost.flops import flops_per_token
from tests.support.specs import tiny_model_spec
from training import metrics
from training.metrics import (cpu_peak_bound, measure_cpu_peak, mfu, mfu_fields,
                              time_matmul_flops)

GF = 1e9


class FakeMeasure:
    """measure(n) answers from a per-size queue of GFLOP/s values, recording each call."""

    def __init__(self, **by_size):
        self.queues = {int(k[1:]): list(v) for k, v in by_size.items()}
        self.calls = []

    def __call__(self, n: int) -> float:
        self.calls.append(n)
        return self.queues[n].pop(0) * GF


def test_timing_takes_the_best_of_its_repeats():
    ticks = itertools.accumulate([0.0, 2.0, 10.0, 1.0, 10.0, 4.0])  # durations 2, 1, 4 s
    rate = time_matmul_flops(8, torch.float32, repeats=3, timer=lambda: next(ticks))
    assert rate == pytest.approx(2 * 8**3 / 1.0)


def test_sizes_that_agree_need_one_round():
    fake = FakeMeasure(n512=[100], n1024=[120])
    peak = measure_cpu_peak("fp32", threads=2, measure=fake)
    assert fake.calls == [512, 1024]
    assert peak.flops == 120 * GF and peak.warnings == ()
    assert "best of 1 round" in peak.source and "1024^3: 120.0" in peak.source


def test_a_busy_first_round_is_retimed_and_the_best_kept():
    # round 1: one size caught the machine busy (9.4 vs 110); round 2: both near the truth
    fake = FakeMeasure(n512=[9.4, 200], n1024=[110, 225])
    peak = measure_cpu_peak("fp32", threads=2, measure=fake)
    assert fake.calls == [512, 1024, 512, 1024]
    assert peak.flops == 225 * GF and peak.warnings == ()


def test_sizes_that_never_agree_are_flagged_with_the_best_kept():
    fake = FakeMeasure(n512=[9, 9, 9], n1024=[100, 50, 60])
    peak = measure_cpu_peak("fp32", threads=2, measure=fake, rounds=3)
    assert len(fake.calls) == 6 and peak.flops == 100 * GF
    assert any("disagree" in w for w in peak.warnings)


def test_a_peak_above_the_physical_bound_is_clamped():
    bound = cpu_peak_bound("fp32", 1)
    fake = FakeMeasure(n512=[1e6], n1024=[1e6])  # 1 PFLOP/s from one thread: a timer glitch
    peak = measure_cpu_peak("fp32", threads=1, measure=fake)
    assert peak.flops == bound and "clamped to bound" in peak.source
    assert any("above the physical bound" in w for w in peak.warnings)


def test_a_peak_far_under_the_bound_is_flagged_as_a_busy_machine():
    fake = FakeMeasure(n512=[1.0], n1024=[1.0])
    peak = measure_cpu_peak("fp32", threads=2, measure=fake)
    assert peak.flops == 1 * GF and any("looks busy" in w for w in peak.warnings)


def test_bound_scales_with_threads_and_dtype():
    assert cpu_peak_bound("fp32", 1) == 64 * metrics.MAX_CORE_CLOCK_HZ
    assert cpu_peak_bound("bf16", 1) > cpu_peak_bound("fp32", 1)
    assert cpu_peak_bound("fp32", 0) == cpu_peak_bound("fp32", 1)


def test_mfu_under_100_percent_is_reported():
    peak = PeakFlops(flops=100 * GF, source="user")
    assert mfu(tokens_per_s_per_device=1000, flops_per_token=50_000_000, peak=peak) == 0.5
    assert mfu_fields(tokens_per_s_per_device=1000, flops_per_token=50_000_000,
                      peak=peak) == {"mfu": 0.5}


def test_mfu_over_100_percent_is_left_out_and_warned_once_with_both_numbers(caplog):
    peak = PeakFlops(flops=9.4 * GF, source="test: under-measured")
    metrics._warned_over_peak.discard(peak.source)
    with caplog.at_level(logging.WARNING, logger="meshrun.metrics"):
        for _ in range(3):
            assert mfu(tokens_per_s_per_device=1000, flops_per_token=27_260_000,
                       peak=peak) is None
        assert mfu_fields(tokens_per_s_per_device=1000, flops_per_token=27_260_000,
                          peak=peak) == {}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "290%" in warnings[0] and "2.726e+10" in warnings[0] and "9.4e+09" in warnings[0]


def test_mfu_with_an_unknown_peak_is_left_out():
    peak = PeakFlops(flops=float("nan"), source="unknown device X")
    assert mfu_fields(tokens_per_s_per_device=1000, flops_per_token=10, peak=peak) == {}


def test_the_named_attention_count_matches_the_cost_model():
    """FLOPS_ATTENTION names what flops_per_token counts: "full" is 12*L*H*Q*T per token."""
    model = tiny_model_spec()
    attention = flops_per_token(model, 128) - flops_per_token(model, 0)
    full = 12 * model.n_layers * model.n_heads * model.head_dim * 128
    assert attention == {"full": full, "causal": full // 2}[metrics.FLOPS_ATTENTION]


def test_user_peak_overrides_the_measurement_and_the_log_line_names_everything(caplog,
                                                                                monkeypatch):
    from tests.support.specs import cpu_spec
    from training.metrics import resolve_peak

    monkeypatch.setattr(metrics, "measure_cpu_peak", lambda *a, **k: pytest.fail("measured"))
    spec = cpu_spec("model=debug", "training.cpu_peak_flops=1.5e11")
    with caplog.at_level(logging.INFO, logger="meshrun.metrics"):
        peak = resolve_peak(spec, torch.device("cpu"))
    assert peak == PeakFlops(flops=1.5e11, source="user (training.cpu_peak_flops)")
    line = caplog.records[-1].getMessage()
    assert "1.5e+11" in line and "user (training.cpu_peak_flops)" in line
    assert "6N + 12*L*H*Q*T" in line and "attention counted full" in line
