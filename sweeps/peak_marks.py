"""Runs whose MFU divides by another peak than the others': marked in `meshrun compare`'s table
and report.html (a `*` after the peak_flops cell) and named in one note, never shown silently
side by side. On CPU the peak is stored per host (training/cpu_peak_cache.py), so runs of one
host share it; runs measured elsewhere, re-measured, or given training.cpu_peak_flops differ."""
from __future__ import annotations

from collections import Counter

MARK = "*"
PEAK_COLUMN = "peak_flops"
SAME_WITHIN = 1e-9
"""Relative difference under which two peaks are the same number (JSON round trips)."""


def _key(flops: float) -> float:
    return float(f"{flops:.9g}")


def marked_runs(records) -> set[str]:
    """Names of the runs whose peak is not the most common peak among `records` (runs with
    no recorded peak are left out: made before peaks were recorded, or never reached step 1)."""
    peaks = {r.name: r.outcomes.get(PEAK_COLUMN) for r in records}
    known = {name: _key(p) for name, p in peaks.items() if isinstance(p, (int, float)) and p > 0}
    if len(set(known.values())) <= 1:
        return set()
    usual = Counter(known.values()).most_common(1)[0][0]
    return {name for name, peak in known.items() if peak != usual}


def peak_note(records) -> str:
    """One line when the runs' peaks differ ("" when they agree)."""
    known = sorted({_key(p) for r in records
                    if isinstance(p := r.outcomes.get(PEAK_COLUMN), (int, float)) and p > 0})
    if len(known) <= 1:
        return ""
    shown = ", ".join(f"{p / 1e9:,.1f}" for p in known)
    return (f"{MARK} these runs' MFU divides by {len(known)} different peaks ({shown} GFLOP/s): "
            f"MFU compares only between runs with the same peak_flops. Runs on one host share "
            "its stored CPU peak (training.cpu_peak=host); see each run's summary.json "
            "peak_flops_source.")


def marked_cell(text: str, *, name: str, column: str, marked: set[str]) -> str:
    return f"{text} {MARK}" if column == PEAK_COLUMN and name in marked else text
