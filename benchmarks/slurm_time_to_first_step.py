"""Seconds from `meshrun run cluster=slurm ...` to the first training step (and to the end).

Needs SLURM_CONF pointing at a cluster, e.g. the local test cluster:
    .venv/bin/python -m tests.slurm.cluster up /tmp/slurm-bench   # prints export SLURM_CONF=...
    .venv/bin/python benchmarks/slurm_time_to_first_step.py [--rounds N] [extra overrides]

Prints, in seconds from the command's start (median over rounds): the task pickled (submitit's
*_submitted.pkl written), then from rank 0's log (benchmarks/launch_overhead.py reads it the
same way) the rank reaching training.main (Slurm scheduling, srun, Python, submitit's unpickle,
and `import torch`: training.slurm_entry imports training.dist before training.main), the rest
of its imports, the join, preflight, the model build, and the first step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_overhead import log_marks  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
OVERRIDES = ["model=tiny", "training.steps=20", "training.seq_len=64",
             "training.micro_batch_size=4", "schedule.warmup_steps=2", "cluster=slurm",
             "cluster.gpus_per_node=0", "cluster.procs_per_node=2", "cluster.nodes=2",
             "cluster.rdzv_host=127.0.0.1", "cluster.time_limit_min=10",
             "cluster.warning_signal=USR1@30", f"cluster.python={sys.executable}"]


def one_round(extra: list[str]) -> tuple[dict[str, float], Path]:
    runs = Path(tempfile.mkdtemp())
    start = time.time()
    subprocess.run([sys.executable, "-m", "launcher.cli", "run", "--wait", *OVERRIDES,
                    *extra, f"runs_dir={runs}"], cwd=REPO, check=True, capture_output=True)
    finished = time.time()
    (run_dir,) = list(runs.iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    marks = log_marks(run_dir / "logs" / "rank0.log")
    (pickled,) = list((run_dir / "slurm").glob("*/*_submitted.pkl"))
    marks["task pickled"] = pickled.stat().st_mtime
    marks["first training step"] = next(r["time"] for r in rows if r["kind"] == "train")
    marks["job finished (--wait returned)"] = finished
    return {name: t - start for name, t in marks.items()}, run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="extra meshrun overrides")
    args = parser.parse_args()
    rounds = []
    for _ in range(args.rounds):
        marks, run_dir = one_round(args.overrides)
        rounds.append(marks)
    print(f"meshrun run cluster=slurm (2 nodes x 2 ranks), median of {args.rounds} round(s), "
          "s from enter:")
    for name in sorted(rounds[0], key=lambda n: statistics.median(r[n] for r in rounds)):
        print(f"  -> {name:<32} {statistics.median(r[name] for r in rounds):6.2f}")
    from conf.run_dir.preflight_report import format_report

    print(format_report(json.loads((run_dir / "preflight.json").read_text())))


if __name__ == "__main__":
    main()
