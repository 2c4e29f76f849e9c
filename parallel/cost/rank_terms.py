"""Why one layout ranks below (or above) another: the step-time terms that differ most
between their two step-time breakdowns (parallel.cost.step_time.StepBreakdown), read by the
search's `why` and by `plan --search --rank-of`. Torch-free."""
from __future__ import annotations

TERMS = {"compute_s": "compute", "comm_exposed_s": "exposed comm", "bubble_s": "bubble",
         "overhead_s": "per-layer overhead", "optimizer_s": "optimizer",
         "offload_s": "offload"}
"""The terms that add up to a step, as the reasons name them."""
SHOWN = 3
NOISE_S = 1e-4


def decided_by(ours, theirs) -> str:
    """`ours` against `theirs` (two breakdowns of the same tokens per step): the SHOWN terms
    that differ most, as signed milliseconds per step, e.g. 'compute +524 ms, exposed comm
    +378 ms'; '' when none differs."""
    if ours is None or theirs is None:
        return ""
    diffs = sorted(((getattr(ours, k, 0.0) - getattr(theirs, k, 0.0), label)
                    for k, label in TERMS.items()), key=lambda d: -abs(d[0]))
    return ", ".join(f"{label} {d * 1e3:+.0f} ms" for d, label in diffs[:SHOWN]
                     if abs(d) > NOISE_S)
