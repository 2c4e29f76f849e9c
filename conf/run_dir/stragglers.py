"""A rank persistently slower than the others: named by `meshrun status` and the summary.

Each train row carries TIME_BY_RANK_KEY = {"step_time_s" | "wait_s" | "compute_s": [one value
per rank]} (training/rank_times.py). A rank is slow on a step when its compute time exceeds
the median over the ranks by more than SLOWER_FRACTION; it is a straggler when it was slow on
at least PERSISTENT_FRACTION of the last WINDOW steps of the newest leg (rows after the last
resume row: another leg may run on other nodes) that carry the split (MIN_STEPS at least).
Where the measured wait misses some of a run's collectives (`why_wait_is_partial`), its train
rows say why under WAIT_PARTIAL_KEY, and status and the summary repeat it (`wait_partial`): a
run with no straggler named is then not shown as one without.
"""
from __future__ import annotations

import statistics

from conf.run_dir.metrics_rows import RESUME_ROW_KIND

TIME_BY_RANK_KEY = "time_by_rank"
TIME_STATS = ("step_time_s", "wait_s", "compute_s")
WAIT_PARTIAL_KEY = "wait_partial"
WINDOW = 20
MIN_STEPS = 5
SLOWER_FRACTION = 0.2
PERSISTENT_FRACTION = 0.5


def _split_rows(rows: list[dict]) -> list[dict]:
    """The train rows of the newest leg that carry the split of more than one rank."""
    resumes = [i for i, r in enumerate(rows) if r.get("kind") == RESUME_ROW_KIND]
    leg = rows[resumes[-1] + 1:] if resumes else rows
    return [r for r in leg if r.get("kind") == "train"
            and len(r.get(TIME_BY_RANK_KEY, {}).get("compute_s", [])) > 1]


def stragglers(rows: list[dict]) -> list[dict]:
    """[{rank, slow_steps, steps, compute_s, median_compute_s, wait_s}] for each straggler."""
    split = [r[TIME_BY_RANK_KEY] for r in _split_rows(rows)]
    recent = split[-WINDOW:]
    if len(recent) < MIN_STEPS:
        return []
    ranks = len(recent[-1]["compute_s"])
    recent = [r for r in recent if len(r["compute_s"]) == ranks]
    found = []
    for rank in range(ranks):
        slow = [r for r in recent
                if r["compute_s"][rank] > (1 + SLOWER_FRACTION) * statistics.median(r["compute_s"])]
        if len(slow) >= PERSISTENT_FRACTION * len(recent):
            found.append({
                "rank": rank, "slow_steps": len(slow), "steps": len(recent),
                "compute_s": statistics.fmean(r["compute_s"][rank] for r in recent),
                "median_compute_s": statistics.fmean(statistics.median(r["compute_s"])
                                                     for r in recent),
                "wait_s": statistics.fmean(r["wait_s"][rank] for r in recent)})
    return found


def wait_partial(rows: list[dict]) -> str:
    """Why the newest leg's wait misses collectives, as its rows say; "" if it misses none."""
    split = _split_rows(rows)
    return split[-1].get(WAIT_PARTIAL_KEY, "") if split else ""


def why_wait_is_partial(spec) -> str:
    """Why the wait measured for `spec`'s run (training/collective_waits.py: the host time
    blocked in torch's collective waits) misses some of its collectives; "" when it misses
    none (every layout on CPU, eager)."""
    if spec.training.device == "cuda":
        return ("wait is partial: on CUDA a collective wait only orders streams, so the host "
                "time measured misses the device's wait (a straggler may go unnamed)")
    if spec.training.compile and spec.parallel.tp > 1:
        return ("wait is partial: tensor-parallel collectives compiled into the blocks "
                "(training.compile) are waited inside the graph, unmeasured (a straggler may "
                "go unnamed)")
    return ""


def describe_straggler(s: dict) -> str:
    return (f"rank {s['rank']} is a straggler: compute {s['compute_s'] * 1000:.0f} ms/step vs "
            f"the median rank's {s['median_compute_s'] * 1000:.0f} ms, slower by >"
            f"{SLOWER_FRACTION:.0%} on {s['slow_steps']} of the last {s['steps']} steps (it "
            f"waits {s['wait_s'] * 1000:.0f} ms/step; the others wait for it)")
