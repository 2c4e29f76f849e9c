"""metrics.jsonl's rows as every reader sees them: the row kinds and events the loop writes,
and the reader that turns the file into the run's current history (torn or foreign lines
skipped, rows a resumed leg superseded dropped). Rank 0 appends the rows (training/loggers.py);
`meshrun status`, `compare`, the sweeps and summary.json read them through here.
"""
from __future__ import annotations

import json
from pathlib import Path

RESUME_ROW_KIND = "resume"
"""metrics.jsonl is append-only: a resumed leg first appends {"kind": "resume", "step": S}
(the checkpoint step it continues from); rows of steps after S written before it belong to a
leg that died before its next checkpoint, and readers drop them (each step's last row wins)."""
FAILED_EVENT = "failed"
"""The loop's event when it gives up (a non-finite loss); its row carries step, loss, message."""
PEAK_ROW_KIND = "peak"
"""Rank 0 writes one {"kind": "peak", "step", "peak_flops", "source"} row per leg, before its
first step: the peak FLOP/s that leg's MFU divides by (training/metrics.py)."""
NOTE_ROW_KIND = "note"
"""{"kind": "note", "step": S, "message": "..."}: a one-off line the launcher's console shows
as it is (where a run's weights came from); no state or metric reads it."""
PREFLIGHT_EVENT = "preflight passed"
"""The one event of a `meshrun preflight` run dir, noted by the launcher once every rank passed."""


def read_metrics_rows(path: Path) -> list[dict]:
    """Every complete row of a metrics.jsonl as the run's current history: a last line still
    being written and any line that is not a JSON object are skipped; rows superseded by a
    later resume marker are dropped."""
    path = Path(path)
    if not path.exists():
        return []
    text = path.read_text(errors="replace")
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines = lines[:-1]  # the writer has not finished this line yet
    return history(row for row in map(parse_metrics_line, lines) if row is not None)


def parse_metrics_line(line: str) -> dict | None:
    """One metrics row, or None for a blank, torn or foreign line (never raises)."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except ValueError:
        return None
    return row if isinstance(row, dict) else None


def history(rows) -> list[dict]:
    """Apply resume markers: a marker at step S drops the rows of steps after S before it."""
    kept: list[dict] = []
    for row in rows:
        if row.get("kind") == RESUME_ROW_KIND:
            step = row.get("step", 0)
            kept = [r for r in kept if r.get("step", 0) <= step]
        kept.append(row)
    return kept
