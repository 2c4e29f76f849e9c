"""The CUDA caching allocator's reserved peak beside the plan's allocated one
(parallel/cost/allocator_reserve.py): the ratio's order (knob, calibration, default), its fit
to runs' logged peaks by `meshrun plan --calibrate`, and where the plan shows it. Torch-free."""
from __future__ import annotations

import json
from functools import cache

import pytest

from parallel.cost.allocator_reserve import (
    DEFAULT_RESERVED_RATIO, estimate_reserved, fit_reserved_ratio,
)
from parallel.cost.plan import make_plan
from tests.support.run_outputs import written_run_dir
from tests.support.specs import cpu_spec

spec = cache(cpu_spec)
H100 = ("model=tiny", "data=synthetic", "cluster=slurm", "cluster.gpu_name=H100",
        "cluster.gpus_per_node=8", "parallel=fsdp")
NAN = float("nan")
# per logged step: (mem_reserved_peak_gib, mem_peak_gib)
PEAKS = {1: (10.0, 9.0), 2: (13.0, 10.0), 3: (NAN, 10.0), 4: (9.0, 10.0), 5: (12.5, 10.0),
         6: (13.0, 0.0)}
FITTED = 1.3
"""By hand: 10/9 = 1.111, 13/10 = 1.3, 12.5/10 = 1.25; NaN, a reserve below the allocation
(0.9) and a zero allocation are no measurement. The max is 1.3."""


def _rows(peaks: dict) -> list[dict]:
    return [{"kind": "train", "step": step, "step_time_s": 0.5, "mem_reserved_peak_gib": r,
             "mem_peak_gib": a} for step, (r, a) in peaks.items()]


def test_fit_is_the_largest_valid_ratio_and_none_without_peaks():
    assert fit_reserved_ratio(_rows(PEAKS)) == pytest.approx(FITTED)
    assert fit_reserved_ratio(_rows({1: (NAN, 1.0), 2: (0.5, 1.0)})) is None
    cpu_rows = [{"kind": "train", "step": 1, "step_time_s": 0.5, "mem_peak_gib": 2.0}]
    assert fit_reserved_ratio(cpu_rows) is None
    eval_row = {"kind": "eval", "mem_reserved_peak_gib": 50.0, "mem_peak_gib": 1.0}
    assert fit_reserved_ratio([*_rows(PEAKS), eval_row]) == pytest.approx(FITTED)


def test_the_knob_wins_over_the_calibration_over_the_default():
    peak = 10 * 2**30
    default = estimate_reserved(spec(*H100, "cluster.calibration=none"), peak)
    assert (default.ratio, default.source) == (DEFAULT_RESERVED_RATIO, "default")
    assert default.bytes == round(peak * DEFAULT_RESERVED_RATIO)
    calibrated = estimate_reserved(spec(*H100), peak, calibration={"reserved_ratio": 1.4})
    assert (calibrated.ratio, calibrated.source, calibrated.bytes) == (1.4, "calibration",
                                                                       14 * 2**30)
    mine = estimate_reserved(spec(*H100, "cluster.reserved_ratio=1.05"), peak,
                             calibration={"reserved_ratio": 1.4})
    assert (mine.ratio, mine.source) == (1.05, "cluster")
    assert estimate_reserved(spec("model=tiny"), peak) is None  # a CPU rank: no CUDA allocator


def test_calibrate_stores_it_and_the_plan_shows_it(tmp_path, capsys):
    from launcher.cli import main

    run = written_run_dir(tmp_path, "h100", spec(*H100), _rows(PEAKS))
    out = tmp_path / "cal.json"
    assert main(["plan", "--calibration-out", str(out), "--calibrate", str(run)]) == 0
    assert f"reserved_ratio = {FITTED:.4g}" in capsys.readouterr().out
    assert json.loads(out.read_text())["devices"]["H100"]["reserved_ratio"] == \
        pytest.approx(FITTED)

    assert main(["plan", *H100, f"cluster.calibration={out}", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["reserved"]["source"] == "calibration"
    assert shown["reserved"]["bytes"] == round(shown["memory_bytes"]["peak"] * FITTED)
    assert main(["plan", *H100, f"cluster.calibration={out}"]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "reserved (est.)" in text and f"x{FITTED:.2f} the peak above (calibration" in text

    # a CPU run calibrates its own device: nothing of the H100's entry moves
    cpu = written_run_dir(tmp_path, "cpu", spec("model=tiny", "data=synthetic"),
                   [{"kind": "train", "step": i, "step_time_s": 0.5, "mem_peak_gib": 1.0}
                    for i in range(1, 6)])
    assert main(["plan", "--calibration-out", str(out), "--calibrate", str(cpu)]) == 0
    stored = json.loads(out.read_text())["devices"]
    assert stored["H100"]["reserved_ratio"] == pytest.approx(FITTED)
    assert "reserved_ratio" not in stored["CPU core"]


def test_the_fit_verdict_stays_on_the_allocated_peak_and_the_plan_says_what_over_means(
        capsys):
    from launcher.cli import main

    big = ("model=llama3_8b", *H100[1:], "training.seq_len=2048", "training.micro_batch_size=2")
    for ratio, over in (("1.05", False), ("1.9", True)):
        s = spec(*big, f"cluster.reserved_ratio={ratio}")
        plan = make_plan(s)
        reserved = estimate_reserved(s, plan.memory.total).bytes
        assert plan.verdict.fits and plan.verdict.need_bytes == plan.memory.total
        assert (reserved > plan.verdict.device_bytes) is over
        assert main(["plan", *big, f"cluster.reserved_ratio={ratio}"]) == 0
        text = " ".join(capsys.readouterr().out.replace("│", " ").split())
        assert ("the allocator will empty its cache and retry" in text) is over


@pytest.mark.parametrize("value,rule", [("0.5", "at least 1"), ("-1", "at least 1"),
                                        ("inf", "finite"), ("nan", "finite")])
def test_a_ratio_below_one_is_refused_naming_the_key(capsys, value, rule):
    from launcher.cli import main

    assert main(["plan", *H100, f"cluster.reserved_ratio={value}"]) == 2
    err = capsys.readouterr().err
    assert f"cluster.reserved_ratio={value}" in err and rule in err
    assert "Traceback" not in err


def test_a_calibration_file_with_a_ratio_below_one_is_refused(tmp_path, capsys):
    from launcher.cli import main

    hand_edited = tmp_path / "cal.json"
    hand_edited.write_text(json.dumps({"schema": "meshrun.calibration/1",
                                       "devices": {"H100": {"reserved_ratio": 0.5}}}))
    assert main(["plan", *H100, f"cluster.calibration={hand_edited}", "--json"]) == 2
    err = capsys.readouterr().err
    assert "H100.reserved_ratio=0.5" in err and "below 1" in err and "Traceback" not in err
