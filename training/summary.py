"""summary.json: the final numbers of a run, computed from metrics.jsonl (the source of truth)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from parallel.cost.flops import FLOPS_CONVENTION
from training.loggers import METRICS_FILE

SUMMARY_FILE = "summary.json"
WARMUP_FRACTION = 0.1  # steps left out of the throughput means (compile, allocator, caches)


def read_rows(run_dir: Path) -> list[dict]:
    """Every complete row of metrics.jsonl; a last line still being written is skipped."""
    path = run_dir / METRICS_FILE
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.split("\n")
    if not text.endswith("\n"):
        lines = lines[:-1]  # the writer has not finished this line yet
    return [json.loads(line) for line in lines if line.strip()]


def summarize(run_dir: Path, *, peak_source: str, last_checkpoint: str, export_dir: str) -> dict:
    rows = read_rows(run_dir)
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    steady = train[int(len(train) * WARMUP_FRACTION):] or train
    first_val = evals[0]["val_loss"] if evals else None
    final_val = evals[-1]["val_loss"] if evals else None
    return {
        "steps_done": train[-1]["step"] if train else 0,
        "final_loss": train[-1]["loss"] if train else None,
        "first_val_loss": first_val,
        "final_val_loss": final_val,
        "best_val_loss": min(r["val_loss"] for r in evals) if evals else None,
        "val_loss_drop": 1 - final_val / first_val if first_val else None,
        "tokens_per_s": _mean(steady, "tokens_per_s"),
        "tokens_per_s_per_device": _mean(steady, "tokens_per_s_per_device"),
        "mfu": _mean(steady, "mfu"),
        "peak_mem_gib": max((r.get("mem_peak_gib", 0.0) for r in train), default=None),
        "wall_s": _wall_s(rows),
        "flops_convention": FLOPS_CONVENTION,
        "peak_flops_source": peak_source,
        "last_checkpoint": last_checkpoint,
        "export_dir": export_dir,
    }


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.fmean(values) if values else None


def _wall_s(rows: list[dict]) -> float | None:
    times = [r["time"] for r in rows if "time" in r]
    return max(times) - min(times) if len(times) > 1 else None


def write_summary(run_dir: Path, summary: dict) -> None:
    (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
