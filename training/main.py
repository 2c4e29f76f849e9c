"""The rank entry point: `python -m training <run_dir>` (started by torchrun on every rank).

It reads spec.json only; it never composes Hydra config or parses overrides.
"""
from __future__ import annotations

import gc
import logging
import os
import sys
from pathlib import Path

from conf.spec_io import read_spec


def setup_logging(run_dir: Path, rank: int) -> None:
    """Each rank logs to logs/rank<R>.log; rank 0 also to stdout (torchrun.log)."""
    handlers: list[logging.Handler] = [logging.FileHandler(run_dir / "logs" / f"rank{rank}.log")]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stdout))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s")


def run(run_dir: Path) -> None:
    import torch

    from training.dist import init_distributed, teardown
    from training.loop import train
    from training.trainer import build_trainer

    spec = read_spec(run_dir / "spec.json")
    ctx = init_distributed(spec.training.device)
    setup_logging(run_dir, ctx.rank)
    log = logging.getLogger("meshrun.main")
    log.info("rank %d/%d on %s, torch %s", ctx.rank, ctx.world_size, ctx.device,
             torch.__version__)
    try:
        trainer = build_trainer(spec, run_dir, ctx)
        train(trainer)
    except BaseException:
        log.exception("rank %d failed", ctx.rank)
        raise
    # Free DDP's reducer while the process group is alive: freeing it after destroy ran gloo's
    # destructor with the GIL held while a gloo thread waited for the GIL (a hang, seen here).
    del trainer
    gc.collect()
    teardown()


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not (Path(args[0]) / "spec.json").is_file():
        sys.stderr.write("usage: python -m training <run_dir>  (a folder holding spec.json)\n")
        return 2
    record(run)(Path(args[0]).resolve())
    # Everything is written and every rank passed the final barrier: leave without running
    # interpreter-exit destructors of torch's C++ objects, which can deadlock at teardown.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
