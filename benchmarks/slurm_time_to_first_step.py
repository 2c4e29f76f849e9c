"""Seconds from `meshrun run cluster=slurm ...` to the first training step (and to the end).

Needs SLURM_CONF pointing at a cluster, e.g. the local test cluster:
    .venv/bin/python -m tests.slurm.cluster up /tmp/slurm-bench   # prints export SLURM_CONF=...
    .venv/bin/python benchmarks/slurm_time_to_first_step.py [extra overrides]
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OVERRIDES = ["model=tiny", "training.steps=20", "training.seq_len=64",
             "training.micro_batch_size=4", "schedule.warmup_steps=2", "cluster=slurm",
             "cluster.gpus_per_node=0", "cluster.procs_per_node=2", "cluster.nodes=2",
             "cluster.rdzv_host=127.0.0.1", "cluster.time_limit_min=10",
             "cluster.warning_signal=USR1@30", f"cluster.python={sys.executable}"]


def main() -> None:
    runs = Path(tempfile.mkdtemp())
    start = time.time()
    subprocess.run([sys.executable, "-m", "launcher.cli", "run", "--wait", *OVERRIDES,
                    *sys.argv[1:], f"runs_dir={runs}"], cwd=REPO, check=True,
                   capture_output=True)
    (run_dir,) = list(runs.iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["kind"] == "train")
    report = json.loads((run_dir / "preflight.json").read_text())
    print(f"submit -> first training step: {first['time'] - start:.1f} s")
    print(f"submit -> job finished (meshrun --wait returned): {time.time() - start:.1f} s")
    from conf.preflight_report import format_report

    print(format_report(report))


if __name__ == "__main__":
    main()
