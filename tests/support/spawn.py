"""Run a function on N gloo ranks in fresh processes, for tests.

    results = run_on_ranks(train_fn, world_size=2, workdir=tmp_path, kwargs={"root": ...})

`fn(rank=..., world_size=..., **kwargs)` must be a module-level function (it is pickled by
name into spawned processes). Each rank joins one process group through a `FileStore` in
`workdir`; after `fn` returns, every rank barriers and then destroys the group (skipping the
barrier aborts about one teardown in eight on gloo). A rank that raises fails the test with
that rank's traceback, and the other ranks are terminated; a run past `timeout_s` is killed.
Return values (picklable) come back as a list indexed by rank.

Ranks start from a fork server (multiprocessing's "forkserver") that has imported torch (and
the modules of PRELOADED) once per test process, then fork for each rank: a spawn of two no-op ranks took ~9-19 s with
"spawn" (each rank importing torch on this loaded 2-core machine) and 0.13 s after the
server's first start (~4 s). A forked rank gets what spawn gives it (sys.path, the working
folder: multiprocessing's preparation data) and, passed here, the caller's environment as it
is at the call (the server's is that of its start), set before the process group is made.
"""
from __future__ import annotations

import faulthandler
import multiprocessing
import os
import pickle
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class RankTimeout(TimeoutError):
    """The ranks did not all finish within the time limit."""


PRELOADED = ["torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.fsdp",
             "torch.distributed.checkpoint", "torch.distributed.pipelining",
             "torch.distributed.tensor.parallel", "conf.spec", "conf.run_dir.spec_io",
             "parallel.cost.memory", "training.parallel_model", "training.step",
             "training.data.build", "training.optim", "training.checkpoint",
             "tests.support.spawn"]
"""What the fork server imports once, before it forks the ranks: torch, and what the ranks of
the layout tests import (DTensor, FSDP, DCP, pipelining and the trainer's modules): a forked
rank imported those in 5-15 s on this loaded machine (torch.distributed.pipelining alone
3-9 s), every rank of every spawn. No module of these reads the environment when imported
(the ranks get the caller's, module docstring); a name missing here is imported by the rank."""


def _rank_entry(rank: int, fn: Callable[..., Any], world_size: int, store_path: str,
                result_dir: str, kwargs: dict, environ: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(environ)  # the caller's, not the fork server's (module docstring)
    faulthandler.enable(all_threads=True)  # a native crash prints the rank's Python stacks
    torch.set_num_threads(1)  # N ranks on a 2-core machine: avoid oversubscription
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size)
    result = fn(rank=rank, world_size=world_size, **kwargs)
    dist.barrier()
    dist.destroy_process_group()
    with open(Path(result_dir) / f"result_{rank}.pkl", "wb") as handle:
        pickle.dump(result, handle)


def _join_all(context: mp.ProcessContext, *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=max(0.1, min(1.0, deadline - time.monotonic()))):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join(timeout=5)
            raise RankTimeout(f"ranks still running after {timeout_s:.0f} s; killed them")


def run_on_ranks(fn: Callable[..., Any], *, world_size: int, workdir: Path,
                 kwargs: dict | None = None, timeout_s: float = 180.0) -> list[Any]:
    """Run `fn` on `world_size` gloo ranks; return each rank's result, indexed by rank."""
    run_dir = Path(workdir) / f"spawn_{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True)
    store_path = str(run_dir / "filestore")
    multiprocessing.set_forkserver_preload(PRELOADED)
    context = mp.start_processes(
        _rank_entry, args=(fn, world_size, store_path, str(run_dir), dict(kwargs or {}),
                           dict(os.environ)),
        nprocs=world_size, join=False, start_method="forkserver",
    )
    _join_all(context, timeout_s=timeout_s)
    results = []
    for rank in range(world_size):
        with open(run_dir / f"result_{rank}.pkl", "rb") as handle:
            results.append(pickle.load(handle))
    return results
