"""The numbers of summary.json, from metrics.jsonl's rows: rank 0 writes them when a run ends
(training/summary_json.py adds where they came from) and `meshrun compare` computes them for
unfinished runs too, so both say the same."""
from __future__ import annotations

import statistics

from conf.run_dir.metrics_rows import PEAK_ROW_KIND

WARMUP_FRACTION = 0.1  # steps left out of the throughput means (compile, allocator, caches)


def steady_rows(rows: list[dict]) -> list[dict]:
    """The train rows after warm-up: the first WARMUP_FRACTION of them left out."""
    train = [r for r in rows if r.get("kind") == "train"]
    return train[int(len(train) * WARMUP_FRACTION):] or train


def mfu_after_warmup(rows: list[dict]) -> float | None:
    """THE run's MFU: the mean over its train rows after warm-up. summary.json (and so W&B's
    summary and the end-of-run table), `meshrun compare`, report.html, `meshrun status` and
    `meshrun sweep status` all show this number for a run, finished or not."""
    return _mean(steady_rows(rows), "mfu")


def peak_of(rows: list[dict]) -> dict:
    """The peak FLOP/s MFU divided by and where it came from (the newest leg's peak row:
    training/metrics.py writes one per leg); {} for a run that logged none."""
    peaks = [r for r in rows if r.get("kind") == PEAK_ROW_KIND]
    return ({"peak_flops": peaks[-1].get("peak_flops"), "peak_source": peaks[-1].get("source")}
            if peaks else {})


def outcomes_from_rows(rows: list[dict]) -> dict:
    """The final numbers a run's metrics rows give (summary.json's first keys, in its order);
    `training.summary_json` adds where they came from. Compare uses it for unfinished runs too."""
    train = [r for r in rows if r.get("kind") == "train"]
    evals = [r for r in rows if r.get("kind") == "eval"]
    steady = steady_rows(rows)
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
        "mfu": mfu_after_warmup(rows),
        "peak_flops": peak_of(rows).get("peak_flops"),
        "peak_mem_gib": max((r.get("mem_peak_gib", 0.0) for r in train), default=None),
        "wall_s": _wall_s(rows),
    }


def _mean(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return statistics.fmean(values) if values else None


def _wall_s(rows: list[dict]) -> float | None:
    times = [r["time"] for r in rows if "time" in r]
    return max(times) - min(times) if len(times) > 1 else None
