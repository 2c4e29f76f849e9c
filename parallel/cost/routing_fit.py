"""The expert-parallel load-imbalance factor (`parallel.ep_imbalance`) fitted to the routing
metrics of finished MoE runs, for `meshrun plan --calibrate`. Torch-free.

What a run logs (training/routing_metrics.py): per logged train row and MoE block i,
`moe_l{i}_load_max_mean` = the busiest expert's token copies since the last logged row over
the mean expert's (summed over the ranks that saw different tokens), and `moe_load_max_mean`,
the worst block's.

What the plan needs: the tokens the busiest ep rank receives over the mean. A rank holds E/ep
experts and receives the sum of their loads, and a sum's max/mean is at most its busiest
member's max/mean, so the per-expert ratio bounds the per-rank one for every ep degree (equal
at ep = E): the factor fitted from an ep=1 run is safe for the ep plans of the same model.
The loads are the router's choices before model.moe.capacity_factor drops copies, so with a
capacity the bound can exceed what crosses (never fall short of it).

The statistic: the MAX over the run's train rows past warm-up and over its MoE blocks (and over
the device's runs). The plan times the step by the busiest rank, and every MoE block and every
step waits for its slowest rank, so the factor must be one the runs did not exceed: an upper
bound, not a typical value. A high quantile would drop the worst rows, but a calibration run
logs tens of rows, where a 95th percentile is the max or an interpolation just below it; and
each logged ratio is already an average over log_every steps and every dp rank's tokens
(one micro-batch's peak is higher), so no logged value is an outlier to discard.
Warm-up: rows at steps up to the LR warm-up (schedule.warmup_steps) and the first
WARMUP_STEPS rows (the step-time reading's warm-up) are left out: a router that has not met
its balancing loss yet says nothing of the steady state. A run with no row past them uses all
its rows (their max can only be higher: still an upper bound).
Values that are not finite numbers >= 1 (max/mean is >= 1 by construction) are no
measurement and are skipped, as calibrate.read_run skips bad step times; a MoE run with no
valid value left is refused (ValueError naming the run and the key).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from conf.run_dir.metrics_rows import read_metrics_rows
from conf.run_dir.paths import RunDir
from parallel.cost.calibrate import WARMUP_STEPS
from parallel.cost.params import expert_params

ROUTING_KEY = re.compile(r"^moe(_l\d+)?_load_max_mean$")
"""The logged routing metrics the fit reads: per block and the worst block's."""
FITTED_KEY = "ep_imbalance"
"""The calibration entry's key (the knob parallel.ep_imbalance)."""


def _ratio(value: object) -> bool:
    """A logged max/mean: a finite number >= 1 (NaN, inf, below 1 are not)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 1.0)


def fit_imbalance(rows: list[dict], *, warmup_steps: int) -> float:
    """The max over `rows` (metrics.jsonl rows) past warm-up of their routing ratios (module
    docstring). ValueError when no train row holds a valid one."""
    train = [r for r in rows if r.get("kind") == "train"]
    values = [[v for k, v in r.items() if ROUTING_KEY.match(k) and _ratio(v)] for r in train]
    logged = [(r.get("step", 0), vs) for r, vs in zip(train, values) if vs]
    if not logged:
        raise ValueError("metrics.jsonl has no train rows with a finite moe_load_max_mean "
                         ">= 1 (routing metrics missing or NaN)")
    steady = [vs for step, vs in logged[WARMUP_STEPS:] if step > warmup_steps]
    return max(max(vs) for vs in (steady or [vs for _, vs in logged]))


def read_imbalance(run_dir: Path) -> float | None:
    """The fitted factor of one run dir; None for a dense model (nothing to fit). ValueError
    names the run dir when a MoE run's routing metrics are missing or not finite."""
    rd = RunDir(run_dir)
    spec = rd.read_spec()
    if expert_params(spec.model)[1] == 0:
        return None
    try:
        return fit_imbalance(read_metrics_rows(rd.metrics_file),
                             warmup_steps=spec.schedule.warmup_steps)
    except ValueError as error:
        raise ValueError(f"{run_dir}: a MoE run, but its {error}") from None
