"""summary.json: the final numbers of a run, computed from metrics.jsonl (the source of truth).

The numbers (`conf.run_dir.outcomes`) and the reader of metrics.jsonl
(`conf.run_dir.metrics_rows`) live in conf, which `meshrun compare` uses too; this adds where
they came from (FLOPs convention, peak, checkpoint, export).
"""
from __future__ import annotations

import json
from pathlib import Path

from conf.run_dir.outcomes import outcomes_from_rows
from conf.run_dir.paths import RunDir
from conf.run_dir.stragglers import describe_straggler, stragglers
from parallel.cost.flops import FLOPS_CONVENTION
from training.metrics import FLOPS_ATTENTION


def summarize(run_dir: Path, *, peak_source: str, last_checkpoint: str, export_dir: str,
              flops_convention: str = FLOPS_CONVENTION) -> dict:
    """`flops_convention`: the run's (parallel.cost.flops.run_flops_convention)."""
    rows = RunDir(run_dir).read_rows()
    return {
        **outcomes_from_rows(rows),
        "flops_convention": flops_convention,
        "flops_attention": FLOPS_ATTENTION,
        "peak_flops_source": peak_source,
        "last_checkpoint": last_checkpoint,
        "export_dir": export_dir,
        "stragglers": "; ".join(map(describe_straggler, stragglers(rows))),
    }


def write_summary(run_dir: Path, summary: dict) -> None:
    RunDir(run_dir).summary_file.write_text(json.dumps(summary, indent=2) + "\n")
