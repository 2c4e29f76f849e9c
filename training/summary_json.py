"""summary.json: the final numbers of a run, computed from metrics.jsonl (the source of truth).

The numbers (`conf.run_dir.outcomes`) and the reader of metrics.jsonl
(`conf.run_dir.metrics_rows`) live in conf, which `meshrun compare` uses too; this adds where
they came from (FLOPs convention, peak, checkpoint, export).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from conf.run_dir.disk_space import disk_full_line
from conf.run_dir.outcomes import outcomes_from_rows
from conf.run_dir.paths import RunDir
from conf.run_dir.stragglers import describe_straggler, stragglers, wait_partial
from parallel.cost.flops import FLOPS_CONVENTION
from training.metrics import FLOPS_ATTENTION
from training.step_probes import probe_summary


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
        "wait_partial": wait_partial(rows),
        **probe_summary(run_dir),
    }


def write_summary(run_dir: Path, summary: dict) -> None:
    """Atomic: written beside, then renamed (a killed write never leaves a half summary,
    which would make the run look completed)."""
    final = RunDir(run_dir).summary_file
    tmp = final.with_name(final.name + ".tmp")
    try:
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, final)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        line = disk_full_line(exc, final)
        if line is None:
            raise
        raise OSError(exc.errno, line) from None
