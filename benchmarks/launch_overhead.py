"""Seconds from `meshrun run` to the first training step, against a bare `torchrun`.

Both start the same number of CPU ranks on this machine. The bare torchrun runs a trivial
script (import torch, join a gloo group, all-reduce one tensor, write the time); meshrun runs
the tiny model for one step. Rounds alternate; medians of each phase are printed, the phases
read from rank 0's log timestamps (logs/rank0.log) and metrics.jsonl:

    enter -> rank 0 logs      the CLI (imports, compose, resolve, run dir) + torchrun + rank imports
    -> preflight passed       join/all-reduce/bandwidth check (cluster.preflight)
    -> peak measured          model build, optimizer, data, the CPU peak (the MFU line)
    -> step-0 eval            the first validation pass
    -> step 1 logged          the first training step

    PYTHONPATH=$PWD /work/venv/bin/python benchmarks/launch_overhead.py [--rounds 5] [--procs 2]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OVERRIDES = ["model=tiny", "data=synthetic", "training.steps=1", "training.seq_len=32",
             "training.micro_batch_size=2", "training.global_batch_size=8",
             "training.grad_accum_steps=-1", "training.eval_every=0", "logging=disabled",
             "checkpoint.every_steps=0", "checkpoint.export_safetensors=false"]
TRIVIAL = """
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
if dist.get_rank() == 0:
    open(sys.argv[1], "w").write(repr(time.time()))
dist.destroy_process_group()
"""
MARKS = {"rank 0 logs": r" rank0 meshrun\.main INFO rank 0/",
         "preflight passed": r"preflight passed", "peak measured": r"MFU = achieved",
         "step-0 eval": r"step 0: val loss"}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def bare_torchrun(procs: int, work: Path) -> float:
    script, done = work / "trivial.py", work / "done.txt"
    script.write_text(TRIVIAL)
    start = time.time()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc_per_node={procs}", str(script), str(done)], check=True,
                   capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return float(done.read_text()) - start


def _log_times(log: Path) -> dict[str, float]:
    times = {}
    for line in log.read_text().splitlines():
        match = STAMP.match(line)
        for name, pattern in MARKS.items():
            if match and name not in times and re.search(pattern, line):
                stamp = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
                times[name] = stamp.timestamp()
    return times


def meshrun_phases(procs: int, work: Path, extra: list[str]) -> dict[str, float]:
    runs = work / f"runs{time.monotonic_ns()}"
    start = time.time()
    subprocess.run([sys.executable, "-m", "launcher.cli", "run", *OVERRIDES, *extra,
                    f"cluster.procs_per_node={procs}", f"runs_dir={runs}"], cwd=REPO,
                   check=True, capture_output=True)
    (run_dir,) = list(runs.iterdir())
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    marks = _log_times(run_dir / "logs" / "rank0.log")
    marks["step 1 logged"] = next(r["time"] for r in rows if r["kind"] == "train")
    return {name: t - start for name, t in sorted(marks.items(), key=lambda kv: kv[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="extra meshrun overrides")
    args = parser.parse_args()
    bare, phases = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            bare.append(bare_torchrun(args.procs, Path(tmp)))
            phases.append(meshrun_phases(args.procs, Path(tmp), args.overrides))
    print(f"{args.procs} CPU ranks, median of {args.rounds} alternating rounds (s from enter):")
    print(f"  bare torchrun -> trivial all-reduce done: {statistics.median(bare):6.2f}")
    for name in phases[0]:
        values = [p[name] for p in phases if name in p]
        print(f"  meshrun run -> {name:<24} {statistics.median(values):6.2f}")
    first = statistics.median(p["step 1 logged"] for p in phases)
    print(f"  meshrun overhead over bare torchrun: {first - statistics.median(bare):+.2f} s")


if __name__ == "__main__":
    main()
