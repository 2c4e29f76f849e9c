"""Per-step cost of the rank heartbeat (training/heartbeat.py), with against without, side by
side in one run: the real train step (train_step + the metrics gather, as training/loop.py
runs it) on one gloo rank, in alternating blocks, once with the heartbeat writing its file at
every phase, collective and step, and with every collective wait timed as the loop times it
(training/collective_waits.py), once with `NoHeartbeat` (which writes nothing) and no wait
timed. Also the time of one heartbeat file write, how many progress marks a step makes (a
thread writes them), and what timing one collective wait adds (a completed `Work.wait`, with
and without the wrapper; multiply by a layout's waits per step). Neither touches a tensor, so
they add no host sync; the cost is the file writes and a Python call per wait.

    python benchmarks/watchdog_cost.py [--blocks 8 --steps-per-block 10] [overrides...]
    # default overrides: model=tiny data=synthetic training.seq_len=32 training.micro_batch_size=4
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.core_vs_plain_loop import build_core  # noqa: E402

DEFAULT_OVERRIDES = ["model=tiny", "data=synthetic", "training.seq_len=32",
                     "training.micro_batch_size=4", "training.steps=100000"]


def one_step(tr) -> None:
    from training.loop import _add_throughput, train_step

    started = time.perf_counter()
    tr.heartbeat.take_wait_s()
    row = train_step(tr)
    row["step_time_s"] = time.perf_counter() - started
    tr.heartbeat.end_step(tr.step, row["step_time_s"])
    _add_throughput(tr, row)


def block_s(tr, heartbeat, steps: int, *, time_waits: bool = False) -> list[float]:
    from training.collective_waits import time_collective_waits

    tr.heartbeat = heartbeat
    restore = time_collective_waits(heartbeat) if time_waits else (lambda: None)
    times = []
    try:
        for _ in range(steps):
            started = time.perf_counter()
            one_step(tr)
            times.append(time.perf_counter() - started)
    finally:
        restore()
    return times


def timed_wait_us(heartbeat, n: int = 20000) -> tuple[float, float]:
    """(us per `Work.wait` of a completed all-reduce, the same with the wait timed)."""
    import torch
    import torch.distributed as dist

    from training.collective_waits import time_collective_waits

    work = dist.all_reduce(torch.zeros(1), async_op=True)
    work.wait()

    def per_wait_us() -> float:
        started = time.perf_counter()
        for _ in range(n):
            work.wait()
        return (time.perf_counter() - started) / n * 1e6

    plain = per_wait_us()
    restore = time_collective_waits(heartbeat)
    try:
        timed = per_wait_us()
    finally:
        restore()
    return plain, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps-per-block", type=int, default=10)
    args, overrides = parser.parse_known_args()
    from training.heartbeat import FLUSH_S, Heartbeat, NoHeartbeat

    spec, tr = build_core(overrides or DEFAULT_OVERRIDES)
    live = Heartbeat(tr.run_dir, rank=0, host="bench")
    block_s(tr, NoHeartbeat(), 3)  # warm-up
    with_hb, without = [], []
    for _ in range(args.blocks):
        with_hb += block_s(tr, live, args.steps_per_block, time_waits=True)
        without += block_s(tr, NoHeartbeat(), args.steps_per_block)
    beats_before = live.beat
    one_step_with(tr, live)
    writes_per_step = live.beat - beats_before
    plain_us, timed_us = timed_wait_us(NoHeartbeat())
    n = 2000
    started = time.perf_counter()
    for _ in range(n):
        live.write()
    write_us = (time.perf_counter() - started) / n * 1e6
    med_with, med_without = statistics.median(with_hb), statistics.median(without)
    print(f"model {spec.model.name}, {len(with_hb)} steps each, alternating blocks of "
          f"{args.steps_per_block}")
    print(f"median step without heartbeat: {med_without * 1e3:.3f} ms")
    print(f"median step with heartbeat and waits timed: {med_with * 1e3:.3f} ms "
          f"(difference {(med_with - med_without) * 1e3:+.3f} ms, "
          f"{(med_with / med_without - 1):+.2%})")
    print(f"one heartbeat file write: {write_us:.1f} us; progress marks per step: "
          f"{writes_per_step}, written by the heartbeat's thread at most every "
          f"{FLUSH_S * 1e3:.0f} ms (not in the step)")
    print(f"one collective wait (completed Work.wait): {plain_us:.2f} us, timed "
          f"{timed_us:.2f} us ({timed_us - plain_us:+.2f} us per wait)")


def one_step_with(tr, heartbeat) -> None:
    tr.heartbeat = heartbeat
    one_step(tr)


if __name__ == "__main__":
    main()
