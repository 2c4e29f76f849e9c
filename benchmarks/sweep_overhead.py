"""What a sweep point costs beyond its training, beside one `meshrun run` and a bare torchrun.

Each round (rounds alternate, so all three see the same load on a shared machine) times:

  bare torchrun   a trivial script on the same ranks (import torch, join gloo, all-reduce):
                  the floor every launch pays (python, import torch twice, rendezvous)
  meshrun run     the tiny model, --steps steps, the default logging (W&B offline)
  sweep           the same run as --points points (optim.lr varied), one after another

Overhead = wall time minus training time, training time being the span between a run's first
and last train rows in metrics.jsonl (so step 1's warm-up counts as overhead in every column
alike). A sweep's per-point overhead is (wall - the points' training times) / points. The
issue's target: per point no more than one `meshrun run` launch costs over bare torchrun.

Where a point's time goes is read from its run dir (median over points and rounds, s from the
moment its run dir was written): torchrun up (rank python started), rank imports done, joined,
step 1, last step, summary written, lock released (launcher.lock's last write) and the gap to
the next point's run dir (the runner's own work).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/sweep_overhead.py [--rounds 3] [--points 3]
        [--steps 20] [--against /path/to/other/checkout]

--against runs another checkout's `meshrun run` and sweep in the same rounds (e.g. the main
branch: before and after a change, measured under the same load).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_overhead import REPO, TRIVIAL, _env_for  # noqa: E402

LRS = ("1e-4", "3e-4", "1e-3", "3e-3", "1e-2")
STARTUP = re.compile(r"^(\S+ \S+) rank0 meshrun\.main INFO .*start-up ([\d.]+) s: imports ([\d.]+)")


def base_overrides(steps: int) -> list[str]:
    return ["model=tiny", f"training.steps={steps}"]


def bare_torchrun(procs: int, work: Path) -> float:
    script = work / "trivial.py"
    script.write_text(TRIVIAL)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc_per_node={procs}", str(script), str(work / "done.json")],
                   check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - start


def meshrun(repo: Path, args: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=repo,
                          capture_output=True, text=True, env=_env_for(repo))
    if done.returncode != 0:
        raise SystemExit(f"meshrun {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - start


def train_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == "train"]


def training_s(run_dir: Path) -> float:
    rows = train_rows(run_dir)
    return rows[-1]["time"] - rows[0]["time"]


def point_phases(run_dir: Path) -> dict[str, float]:
    """Seconds from the run dir's writing to each phase of the point."""
    t0 = (run_dir / "spec.json").stat().st_mtime
    marks = {}
    match = STARTUP.match((run_dir / "logs" / "rank0.log").read_text())
    if match:
        joined = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        started = joined - float(match.group(2))
        marks.update({"rank python started": started, "rank imports done":
                      started + float(match.group(3)), "joined": joined})
    rows = train_rows(run_dir)
    marks.update({"step 1": rows[0]["time"], "last step": rows[-1]["time"],
                  "summary written": (run_dir / "summary.json").stat().st_mtime,
                  "lock released": (run_dir / "launcher.lock").stat().st_mtime})
    return {name: t - t0 for name, t in marks.items()}


def run_once(repo: Path, procs: int, steps: int, work: Path) -> tuple[float, float]:
    runs = work / f"run{time.monotonic_ns()}"
    wall = meshrun(repo, ["run", *base_overrides(steps), "optim.lr=3e-4",
                          f"cluster.procs_per_node={procs}", f"runs_dir={runs}"])
    (run_dir,) = runs.iterdir()
    return wall, wall - training_s(run_dir)


def sweep_once(repo: Path, procs: int, steps: int, points: int,
               work: Path) -> tuple[float, float, list[dict]]:
    sweep_dir = work / f"sweep{time.monotonic_ns()}"
    wall = meshrun(repo, ["sweep", *base_overrides(steps), f"optim.lr={','.join(LRS[:points])}",
                          f"cluster.procs_per_node={procs}", "--yes", "--dir", str(sweep_dir),
                          f"runs_dir={work / 'sweep-runs'}"])
    run_dirs = sorted((sweep_dir / "runs").iterdir(),
                      key=lambda d: (d / "spec.json").stat().st_mtime)
    phases = [point_phases(d) for d in run_dirs]
    starts = [(d / "spec.json").stat().st_mtime for d in run_dirs]
    for phase, start, following in zip(phases, starts, starts[1:]):
        phase["next point's run dir"] = following - start
    per_point = (wall - sum(training_s(d) for d in run_dirs)) / len(run_dirs)
    return wall, per_point, phases


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(results: dict, procs: int, steps: int, points: int) -> None:
    bare = median(results["bare"])
    print(f"{procs} CPU ranks, tiny model, {steps} steps, sweep of {points} points; median of "
          f"{len(results['bare'])} alternating rounds")
    print(f"  bare torchrun wall                {bare:6.2f} s")
    for label in [k for k in results if k != "bare"]:
        r = results[label]
        run_over, point_over = median(r["run_over"]), median(r["point_over"])
        print(f"  [{label}] meshrun run: wall {median(r['run_wall']):6.2f} s, overhead "
              f"{run_over:6.2f} s = bare {run_over - bare:+.2f} s (x{run_over / bare:.2f})")
        print(f"  [{label}] sweep: wall {median(r['sweep_wall']):6.2f} s, per point overhead "
              f"{point_over:6.2f} s = bare {point_over - bare:+.2f} s (x{point_over / bare:.2f}),"
              f" = run {point_over - run_over:+.2f} s (x{point_over / run_over:.2f})")
        names = list(dict.fromkeys(n for p in r["phases"] for n in p))
        for name in names:
            print(f"      {name:<24} {median([p[name] for p in r['phases'] if name in p]):6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--points", type=int, default=3, choices=range(2, len(LRS) + 1))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--against", type=Path, help="another checkout to time alongside")
    args = parser.parse_args()
    repos = {"this": REPO, **({"against": args.against.resolve()} if args.against else {})}
    results: dict = {"bare": [], **{k: {"run_wall": [], "run_over": [], "sweep_wall": [],
                                        "point_over": [], "phases": []} for k in repos}}
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            results["bare"].append(bare_torchrun(args.procs, Path(tmp)))
            for label, repo in repos.items():
                wall, over = run_once(repo, args.procs, args.steps, Path(tmp))
                results[label]["run_wall"].append(wall)
                results[label]["run_over"].append(over)
                wall, per_point, phases = sweep_once(repo, args.procs, args.steps, args.points,
                                                     Path(tmp))
                results[label]["sweep_wall"].append(wall)
                results[label]["point_over"].append(per_point)
                results[label]["phases"] += phases
            print(f"round {n + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    report(results, args.procs, args.steps, args.points)


if __name__ == "__main__":
    main()
