"""Run the real training loop for several prepared run dirs on spawned gloo ranks.

What a `meshrun run` launch does after torchrun has started the ranks (build_train_state ->
train: steps, eval, checkpoint, gathered export, summary), without paying a torchrun start,
an interpreter start and a preflight per run: one spawn of `world_size` ranks trains every
run dir in turn. Launch-only behaviour (the CLI, torchrun, preflight, the rank entry point) is
checked by the tests that launch for real.

    from tests.support.loop_runs import prepare_run_dir, train_run_dirs
    run_dirs = [prepare_run_dir(spec) for spec in specs]
    run_on_ranks(train_run_dirs, world_size=2, workdir=tmp_path,
                 kwargs={"run_dirs": [str(d) for d in run_dirs]})
"""
from __future__ import annotations

import gc
from pathlib import Path

from conf.spec import RunSpec


def prepare_run_dir(spec: RunSpec) -> Path:
    """A run dir for `spec` under spec.runs_dir, written as the launcher writes it."""
    from launcher.run_dir_writer import create_run_dir

    return create_run_dir(spec, overrides=[], config_yaml="", command=["spawned-ranks"])


def train_run_dirs(*, rank: int, world_size: int, run_dirs: list[str]) -> list[str]:
    """Rank side: train every run dir in turn in this process group; return the outcomes."""
    import torch

    from conf.run_dir.paths import RunDir
    from training.dist import RankContext
    from training.loop import train
    from training.train_state import build_train_state

    ctx = RankContext(rank=rank, local_rank=rank, world_size=world_size,
                      device=torch.device("cpu"))
    outcomes = []
    gc.collect()
    gc.freeze()  # the imports (~300k objects) are never scanned again: each collect below is fast
    try:
        for run_dir in map(Path, run_dirs):
            state = build_train_state(RunDir(run_dir).read_spec(), run_dir, ctx)
            outcomes.append(train(state))
            # As training.main does: free DDP's reducer while the process group is alive.
            del state
            gc.collect()
    finally:
        gc.unfreeze()
    return outcomes
