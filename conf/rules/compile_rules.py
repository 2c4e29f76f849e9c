"""Rules for training.compile (torch.compile per transformer block, parallel/compile.py)."""
from __future__ import annotations

from conf.errors import ProblemList
from conf.schema import RecomputeConfig, RecomputeMode
from conf.spec import ParallelSpec

WHOLE_BLOCK_TARGETS = ("block", "ops")
"""Selective recompute targets that put the whole block forward under one checkpoint."""


def checkpoints_whole_block(recompute: RecomputeConfig) -> bool:
    """recompute re-runs whole blocks (full, or selective block/ops) under a checkpoint."""
    if recompute.mode is RecomputeMode.full:
        return True
    return recompute.mode is RecomputeMode.selective and any(
        target in WHOLE_BLOCK_TARGETS for target in recompute.targets)


def check_compile(*, compile_: bool, parallel: ParallelSpec, recompute: RecomputeConfig,
                  problems: ProblemList) -> None:
    """Context parallel's attention runs eagerly inside a compiled block (its collectives
    are not traceable): Dynamo breaks the graph around it, which it cannot do inside a
    checkpoint region, so a whole-block checkpoint would leave every block uncompiled."""
    cp = parallel.cp
    if not (compile_ and cp > 1 and checkpoints_whole_block(recompute)):
        return
    what = (f"recompute.mode={recompute.mode.value}" if recompute.mode is RecomputeMode.full
            else f"recompute.targets={list(recompute.targets)}")
    problems.add(
        "training.compile", "true",
        f"with parallel.cp={cp} and {what} torch.compile captures no block: each block runs "
        "under one checkpoint that holds context parallel's eager attention (gloo/NCCL "
        "collectives Dynamo cannot trace), so the blocks would silently stay eager",
        "use recompute=selective_attention or recompute=none (both compile), "
        "or training.compile=false")
