"""Rank side of a run trained in two legs in one spawned process group, the second resuming
from an older checkpoint than the first reached (so it replays steps), as a restart after a
crash does: leg 1 pauses at training.stop_at_step, rank 0 removes the checkpoints after
`keep_step`, leg 2 resumes from `keep_step` and trains to the end.

    run_on_ranks(train_two_legs, world_size=2, workdir=tmp_path,
                 kwargs={"run_dir": str(run_dir), "keep_step": 2})
"""
from __future__ import annotations

import gc
import shutil
from dataclasses import replace
from pathlib import Path


def train_two_legs(*, rank: int, world_size: int, run_dir: str, keep_step: int) -> list[str]:
    import torch

    from conf.run_dir.checkpoint_dirs import complete_checkpoints
    from conf.run_dir.paths import RunDir
    from training.dist import RankContext, barrier
    from training.loop import train
    from training.train_state import build_train_state

    ctx = RankContext(rank=rank, local_rank=rank, world_size=world_size,
                      device=torch.device("cpu"))
    spec, path = RunDir(run_dir).read_spec(), Path(run_dir)
    outcomes = [_leg(build_train_state(spec, path, ctx), train)]
    if rank == 0:
        for checkpoint in complete_checkpoints(RunDir(run_dir).checkpoints_dir):
            if int(checkpoint.name.split("_")[-1]) > keep_step:
                shutil.rmtree(checkpoint)
    barrier()
    resumed = replace(spec, training=replace(spec.training, stop_at_step=0))
    outcomes.append(_leg(build_train_state(resumed, path, ctx), train))
    return outcomes


def _leg(state, train) -> str:
    outcome = train(state)
    del state  # as training.main does: free DDP's reducer while the process group is alive
    gc.collect()
    return outcome
