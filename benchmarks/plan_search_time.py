"""Wall time of `meshrun plan --search` for llama3_70b on 1,024 H100s (128 nodes x 8), seq 8192,
4M-token global batch: each run a fresh process (imports, Hydra compose, search, table), median
of 5; and whether torch was imported. Reports, asserts nothing (issue 10's goal: <= 2 s).

    PYTHONPATH=$PWD python benchmarks/plan_search_time.py [--runs 5] [--profile 25]
        [--against DIR]

--profile N: instead, one run in this process under cProfile, its N costliest calls by
cumulative time (where the time goes: imports and Hydra compose, enumeration, per-candidate
memory in parallel/cost/memory.py LayoutMemory, the time model per fitting layout).
--against DIR: alternate each run with one of the same command in another checkout (DIR, e.g.
`git worktree add ../base main`), and give the ratio of the medians: on a shared machine
the CPU-time ratio says what the wall times cannot.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OVERRIDES = ["model=llama3_70b", "cluster=slurm", "cluster.nodes=128", "cluster.gpus_per_node=8",
             "cluster.gpu_name=H100", "cluster.gpu_compute_capability=9.0",
             "training.seq_len=8192", "data=synthetic"]
CODE = ("import sys, time; t = time.perf_counter(); from launcher.cli import main; "
        "rc = main(['plan', '--search', '--top', '10', '--global-batch-tokens', '4194304', "
        "*{overrides!r}]); "
        "print('RESULT', rc, 'torch' in sys.modules, time.perf_counter() - t, file=sys.stderr)")


def one_run(repo: Path = REPO) -> tuple[float, float, bool, float]:
    """(wall seconds of the process, seconds inside it, torch imported, CPU seconds: on a
    shared machine the CPU time says more than the wall time), of the checkout `repo`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(repo), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                      if p and Path(p).resolve() != REPO)]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CODE.format(overrides=OVERRIDES)], cwd=repo,
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    line = [x for x in proc.stderr.splitlines() if x.startswith("RESULT")]
    if proc.returncode or not line:
        sys.exit(f"plan --search failed:\n{proc.stderr[-2000:]}")
    _, rc, torch, inside = line[0].split()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, float(inside), torch == "True", cpu


def profile(top: int) -> None:
    """One search in this process under cProfile; the `top` costliest calls (cumulative)."""
    import cProfile
    import io
    import pstats

    sys.path.insert(0, str(REPO))
    from launcher.cli import main as meshrun

    profiler = cProfile.Profile()
    with contextlib.redirect_stdout(io.StringIO()):
        profiler.runcall(meshrun, ["plan", "--search", "--top", "10", "--global-batch-tokens",
                                   "4194304", *OVERRIDES])
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile one in-process run instead; print the N costliest calls")
    parser.add_argument("--against", type=Path, metavar="DIR",
                        help="alternate the runs with the same command in checkout DIR")
    args = parser.parse_args()
    if args.profile:
        return profile(args.profile)
    trees = {"this checkout": REPO, **({str(args.against): args.against.resolve()}
                                      if args.against else {})}
    runs: dict[str, list] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, repo in trees.items():
            runs[name].append(one_run(repo))
    print(f"meshrun plan --search {' '.join(OVERRIDES)} --global-batch-tokens 4194304")
    for name, mine in runs.items():
        report(name, mine)
    if args.against:
        ours, theirs = runs.values()
        print("this checkout / the other, medians: wall "
              f"{_median(ours, 0) / _median(theirs, 0):.2f}, CPU "
              f"{_median(ours, 3) / _median(theirs, 3):.2f}")
    print(f"load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


def _median(runs: list, field: int) -> float:
    return statistics.median(r[field] for r in runs)


def report(name: str, runs: list) -> None:
    print(f"{name}: wall per run (s): {', '.join(f'{r[0]:.2f}' for r in runs)}")
    print(f"  median wall: {_median(runs, 0):.2f} s (goal <= 2 s); median inside the "
          f"process: {_median(runs, 1):.2f} s; median CPU time of the process: "
          f"{_median(runs, 3):.2f} s; torch imported: {any(r[2] for r in runs)}")


if __name__ == "__main__":
    main()
