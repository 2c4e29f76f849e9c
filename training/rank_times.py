"""Each rank's step time split into compute and wait (blocked in collectives), gathered with
the step's memory stats (one all_gather that already exists: no added host sync).

Wait is measured where a rank blocks on the others: every collective wait of the layout
(training/collective_waits.py: FSDP/ZeRO, TP/SP, pipeline send/recv, CP and the loop's own
collectives), the timed host collectives of the step (training/heartbeat.py `collective`:
the loss all-reduce) and DDP's gradient sync, timed by a comm hook: the time backward waits
after its last gradient bucket was launched, until that bucket's all-reduce completed (the
rank that arrives first waits for the last). The hook averages then all-reduces like DDP's
built-in one (the same arithmetic). On CUDA the timed host collectives also count device
work still queued when they are entered.
"""
from __future__ import annotations

import time

from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from conf.run_dir.stragglers import (TIME_BY_RANK_KEY, TIME_STATS, WAIT_PARTIAL_KEY,
                                      why_wait_is_partial)
from conf.spec import RunSpec
from training.heartbeat import Heartbeat


def step_split(step_time_s: float, wait_s: float) -> dict[str, float]:
    """This rank's share of the gathered stats: step time, wait, compute = step - wait."""
    wait_s = min(wait_s, step_time_s)
    return {"step_time_s": step_time_s, "wait_s": wait_s, "compute_s": step_time_s - wait_s}


def time_fields(by_rank: dict[str, list[float]], *, spec: RunSpec) -> dict:
    """Move the step-time stats out of the gathered stats into the row's TIME_BY_RANK_KEY;
    with WAIT_PARTIAL_KEY where the wait misses some of the run's collectives."""
    fields = {TIME_BY_RANK_KEY: {stat: by_rank.pop(stat) for stat in TIME_STATS if stat in by_rank}}
    partial = why_wait_is_partial(spec)
    return {**fields, WAIT_PARTIAL_KEY: partial} if partial else fields


class GradSyncClock:
    """Times DDP's bucket all-reduces; `settle()` adds the backward's wait to the heartbeat."""

    def __init__(self, group, heartbeat: Heartbeat) -> None:
        self.group, self.heartbeat = group, heartbeat
        self.last_launch = self.last_done = 0.0

    def settle(self) -> None:
        if self.last_done > self.last_launch > 0:
            self.heartbeat.wait_s += self.last_done - self.last_launch
        self.last_launch = self.last_done = 0.0


def _timed_allreduce(clock: GradSyncClock, bucket):
    launched = time.perf_counter()
    clock.last_launch = launched

    def done(fut):
        clock.last_done = max(clock.last_done, time.perf_counter())
        return fut.value()

    return allreduce_hook(clock.group, bucket).then(done)


def time_grad_sync(parts: list, heartbeat: Heartbeat) -> list[GradSyncClock]:
    """Register the timing hook on every DDP part; the clocks to settle after backward."""
    clocks = []
    for part in parts:
        if isinstance(part, DistributedDataParallel):
            clock = GradSyncClock(part.process_group, heartbeat)
            part.register_comm_hook(clock, _timed_allreduce)
            clocks.append(clock)
    return clocks
