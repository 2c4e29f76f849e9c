"""Train run dirs on spawned gloo ranks with one rank slowed: a sleep before each forward of
its model parts (a test-only forward pre-hook, set here, never in the training code)."""
from __future__ import annotations

import gc
import time
from pathlib import Path


def _sleep_before_forward(seconds: float):
    def hook(module, args, kwargs=None):
        time.sleep(seconds)
    return hook


def train_with_a_slow_rank(*, rank: int, world_size: int, runs: list[tuple[str, int]],
                           sleep_s: float, time_waits: bool = True) -> list[str]:
    """Rank side: train each (run dir, slow rank) in turn, the slow rank sleeping `sleep_s`
    before every forward of its parts; the outcomes. `time_waits=False` runs the loop without
    training/collective_waits.py (to show what the split misses without it)."""
    import torch

    import training.loop as loop
    from conf.run_dir.paths import RunDir
    from training.dist import RankContext
    from training.train_state import build_train_state

    if not time_waits:
        loop.time_collective_waits = lambda heartbeat: (lambda: None)
    ctx = RankContext(rank=rank, local_rank=rank, world_size=world_size,
                      device=torch.device("cpu"))
    outcomes = []
    for run_dir, slow_rank in runs:
        state = build_train_state(RunDir(run_dir).read_spec(), Path(run_dir), ctx)
        if rank == slow_rank:
            for part in state.model.parts:
                part.register_forward_pre_hook(_sleep_before_forward(sleep_s))
        outcomes.append(loop.train(state))
        del state
        gc.collect()
    return outcomes
