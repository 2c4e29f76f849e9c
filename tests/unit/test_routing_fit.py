"""parallel.ep_imbalance fitted to MoE runs' routing metrics (parallel/cost/routing_fit.py) by
`meshrun plan --calibrate`, stored per device, and used by later plans unless the knob is set.
Torch-free; the end-to-end check on a real tiny_moe run is in
tests/distributed/test_moe_training.py."""
from __future__ import annotations

import json
import math
from functools import cache

import pytest

from parallel.cost.routing_fit import fit_imbalance, read_imbalance
from parallel.cost.step_time import hardware_of
from tests.support.run_outputs import written_run_dir
from tests.support.specs import cpu_spec

MOE = ("model=tiny_moe", "data=synthetic", "training.seq_len=32", "cluster.procs_per_node=2",
       "training.steps=8", "training.log_every=1", "schedule.warmup_steps=3")
spec = cache(cpu_spec)
NAN = float("nan")
# per logged step: (moe_l1_load_max_mean, moe_l2_load_max_mean)
LOADS = {1: (5.0, 1.2), 2: (4.0, 1.0), 3: (3.0, 1.1), 4: (1.4, 1.9), 5: (NAN, 1.6),
         6: (2.1, 1.3), 7: (1.5, 0.8)}
FITTED = 2.1
"""By hand: steps 1-3 are the LR warm-up (and 1-2 the first WARMUP_STEPS rows); past them
the values are 1.4 1.9 | NaN 1.6 | 2.1 1.3 | 1.5 0.8; NaN and 0.8 (< 1) are no measurement;
the max of the rest is 2.1."""


def _rows(loads: dict, *, step_s: float = 0.5) -> list[dict]:
    rows = []
    for step, (l1, l2) in loads.items():
        valid = [v for v in (l1, l2) if not math.isnan(v)]
        rows.append({"kind": "train", "step": step, "step_time_s": step_s,
                     "moe_l1_load_max_mean": l1, "moe_l2_load_max_mean": l2,
                     "moe_load_max_mean": max(valid) if valid else NAN,
                     "moe_l1_max_expert_share": 7.0})  # not a load ratio: never read
    return rows


def test_fit_is_the_max_past_warm_up_of_the_valid_load_ratios():
    assert fit_imbalance(_rows(LOADS), warmup_steps=3) == FITTED
    # the LR warm-up also counts: with none, step 3's 3.0 is past the first 2 rows
    assert fit_imbalance(_rows(LOADS), warmup_steps=0) == 3.0
    # no row past warm-up: every row (a higher max, still an upper bound)
    assert fit_imbalance(_rows({1: (5.0, 1.2), 2: (4.0, 1.0)}), warmup_steps=3) == 5.0
    with pytest.raises(ValueError, match="routing metrics missing or NaN"):
        fit_imbalance(_rows({1: (NAN, NAN), 5: (NAN, 0.5)}), warmup_steps=0)
    with pytest.raises(ValueError, match="routing metrics missing or NaN"):
        fit_imbalance([{"kind": "train", "step": 4, "step_time_s": 0.5}], warmup_steps=0)


def test_a_dense_run_fits_nothing(tmp_path):
    dense = written_run_dir(tmp_path, "dense", spec("model=tiny", "data=synthetic"), _rows(LOADS))
    assert read_imbalance(dense) is None
    moe = written_run_dir(tmp_path, "moe", spec(*MOE), _rows(LOADS))
    assert read_imbalance(moe) == FITTED


def test_calibrate_stores_and_prints_it_and_later_ep_plans_use_it(tmp_path, capsys):
    from launcher.cli import main

    run = written_run_dir(tmp_path, "moe", spec(*MOE, "parallel=zero3"), _rows(LOADS))
    out = tmp_path / "cal.json"
    assert main(["plan", "--calibration-out", str(out), "--calibrate", str(run)]) == 0
    assert f"ep_imbalance = {FITTED:.4g}" in capsys.readouterr().out
    assert json.loads(out.read_text())["devices"]["CPU core"]["ep_imbalance"] == FITTED
    ep = ("parallel=ep", f"cluster.calibration={out}")
    hw = hardware_of(spec(*MOE, *ep))
    assert (hw.ep_imbalance, hw.sources["ep_imbalance"]) == (FITTED, "calibration")
    explicit = hardware_of(spec(*MOE, *ep, "parallel.ep_imbalance=1.2"))  # the user's wins
    assert (explicit.ep_imbalance, explicit.sources["ep_imbalance"]) == (1.2, "parallel")
    none = hardware_of(spec(*MOE, "parallel=ep", "cluster.calibration=none"))
    assert (none.ep_imbalance, none.sources["ep_imbalance"]) == (1.0, "default")
    assert main(["plan", *MOE, *ep]) == 0  # the plan says which factor it used, and whence
    shown = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert f"ep all-to-all at {FITTED:.3g}x the mean tokens (calibration)" in shown

    # a dense run calibrates the same device: nothing fitted, the MoE runs' factor stays
    dense = written_run_dir(tmp_path, "dense", spec("model=tiny", "data=synthetic"),
                     [{"kind": "train", "step": i, "step_time_s": 0.5} for i in range(1, 6)])
    assert main(["plan", "--calibration-out", str(out), "--calibrate", str(dense)]) == 0
    assert json.loads(out.read_text())["devices"]["CPU core"]["ep_imbalance"] == FITTED


@pytest.mark.parametrize("loads", [{i: (NAN, NAN) for i in range(1, 6)}, None],
                         ids=["nan", "missing"])
def test_a_moe_run_without_routing_metrics_is_refused_and_nothing_is_stored(
        tmp_path, capsys, loads):
    from launcher.cli import main

    rows = _rows(loads) if loads else [{"kind": "train", "step": i, "step_time_s": 0.5}
                                       for i in range(1, 6)]
    bad = written_run_dir(tmp_path, "bad-moe", spec(*MOE), rows)
    good = written_run_dir(tmp_path, "good-dense", spec("model=tiny", "data=synthetic"),
                    [{"kind": "train", "step": i, "step_time_s": 0.5} for i in range(1, 6)])
    out = tmp_path / "cal.json"
    assert main(["plan", "--calibration-out", str(out), "--calibrate", str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad-moe" in err and "routing metrics missing or NaN" in err
    assert "Traceback" not in err and not out.exists()
    assert main(["plan", "--calibration-out", str(out), "--calibrate", str(good)]) == 0
    before = out.read_bytes()
    assert main(["plan", "--calibration-out", str(out), "--calibrate", str(good), str(bad)]) == 2
    assert out.read_bytes() == before and not out.with_suffix(".tmp").exists()
