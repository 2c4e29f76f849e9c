"""Per-step cost of torch's flight recorder (training/flight_recorder.py), on against off, side
by side in one run: the real tiny train step (benchmarks/watchdog_cost.py's `one_step`) in
child processes that alternate TORCH_FR_BUFFER_SIZE=0 and =2000 (the buffer is read when the
process group is created, so each setting needs its own process); the median step of each,
and the time of one world-1 all-reduce of 4 floats under each.

    python benchmarks/flight_recorder_cost.py [--rounds 4 --steps 40] [overrides...]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SETTINGS = {"off": "0", "on": "2000"}


def child(steps: int, overrides: list[str]) -> None:
    import torch
    import torch.distributed as dist

    from benchmarks.core_vs_plain_loop import build_core
    from benchmarks.watchdog_cost import DEFAULT_OVERRIDES, one_step

    _, tr = build_core(overrides or DEFAULT_OVERRIDES)
    for _ in range(5):
        one_step(tr)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        one_step(tr)
        times.append(time.perf_counter() - started)
    t, n = torch.ones(4), 2000
    started = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(t)
    print(json.dumps({"step_s": times, "all_reduce_s": (time.perf_counter() - started) / n}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.child:
        return child(args.steps, overrides)
    steps = {name: [] for name in SETTINGS}
    reduces = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):
        for name, size in SETTINGS.items():
            env = {**os.environ, "TORCH_FR_BUFFER_SIZE": size, "PYTHONPATH": str(REPO)}
            out = subprocess.run([sys.executable, __file__, "--child", f"--steps={args.steps}",
                                  *overrides], env=env, capture_output=True, text=True,
                                 check=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            steps[name] += result["step_s"]
            reduces[name].append(result["all_reduce_s"])
    on, off = statistics.median(steps["on"]), statistics.median(steps["off"])
    print(f"{args.rounds} rounds alternating, {args.steps} steps each")
    print(f"median step, flight recorder off: {off * 1e3:.3f} ms")
    print(f"median step, flight recorder on:  {on * 1e3:.3f} ms "
          f"(difference {(on - off) * 1e3:+.3f} ms, {on / off - 1:+.2%})")
    for name in SETTINGS:
        print(f"one all_reduce of 4 floats (world 1), recorder {name}: "
              f"{statistics.median(reduces[name]) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
