"""The numbers of summary.json, from metrics.jsonl's rows: rank 0 writes them when a run ends
(training/summary_json.py adds where they came from) and `meshrun compare` computes them for
unfinished runs too, so both say the same."""
from __future__ import annotations

import statistics

WARMUP_FRACTION = 0.1  # steps left out of the throughput means (compile, allocator, caches)


def outcomes_from_rows(rows: list[dict]) -> dict:
    """The final numbers a run's metrics rows give (summary.json's first keys, in its order);
    `training.summary_json` adds where they came from. Compare uses it for unfinished runs too."""
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
    }


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.fmean(values) if values else None


def _wall_s(rows: list[dict]) -> float | None:
    times = [r["time"] for r in rows if "time" in r]
    return max(times) - min(times) if len(times) > 1 else None
