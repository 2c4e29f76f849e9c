"""The rank entry point: `python -m training <run_dir>` (started by torchrun on every rank).

It reads spec.json only; it never composes Hydra config or parses overrides.
"""
from __future__ import annotations

import faulthandler
import gc
import logging
import os
import sys
import time
from pathlib import Path

from conf.data_contract.shard_checks import ShardChecksumError
from conf.errors import ConfigError
from conf.run_dir.heartbeats import collective_timeouts_s
from conf.run_dir.paths import RunDir

STARTED = time.time()
"""When this rank's Python reached its entry point (interpreter start-up, ~50 ms, is before)."""


def setup_logging(run_dir: Path, rank: int) -> None:
    """Each rank logs to logs/rank<R>.log; rank 0 also to stdout (torchrun.log)."""
    handlers: list[logging.Handler] = [logging.FileHandler(RunDir(run_dir).rank_log(rank))]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stdout))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True,
                        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s")


PREFLIGHT_ONLY = "--preflight-only"


def run(run_dir: Path, *, preflight_only: bool = False) -> str:
    """Train this rank; return the outcome (finished, paused, stopped, requeued, preflight)."""
    import torch

    from training.dist import init_distributed, node_name, teardown
    from training.hf_import import HfWeightsError
    from training.loggers import BackgroundWandb
    from training.loop import train
    from training.rank_times import time_grad_sync
    from training.train_state import build_train_state

    imported = time.time()
    gc.freeze()  # torch's import-time objects: the collection at the end skips them (~0.5 s)
    spec = RunDir(run_dir).read_spec()
    heartbeat = start_heartbeat(run_dir)
    init_timeout_s, _ = collective_timeouts_s(spec.training.hang_timeout_s,
                                              join_timeout_s=spec.cluster.preflight_timeout_s)
    heartbeat.phase("first_collective")
    with heartbeat.collective("init_process_group"):
        ctx = init_distributed(spec.training.device,
                               join_timeout_s=spec.cluster.preflight_timeout_s,
                               init_timeout_s=init_timeout_s)
    joined = time.time()
    setup_logging(run_dir, ctx.rank)
    log = logging.getLogger("meshrun.main")
    log.info("rank %d/%d on %s (%s, pid %d), torch %s; start-up %.2f s: imports %.2f s, "
             "join %.2f s", ctx.rank, ctx.world_size, ctx.device, node_name(), os.getpid(),
             torch.__version__, joined - STARTED, imported - STARTED, joined - imported)
    wandb = None
    try:
        heartbeat.phase("preflight")
        if preflight_only or (spec.cluster.preflight and ctx.world_size > 1):
            preflight(spec, run_dir, ctx, full_table=preflight_only)
        if preflight_only:
            teardown()
            return "preflight"
        heartbeat.phase("build")
        building = time.time()
        wandb = BackgroundWandb(spec, run_dir) if ctx.is_main else None
        state = build_train_state(spec, run_dir, ctx, wandb=wandb)
        log.info("train state built in %.2f s (model, optimizer, data, MFU peak, loggers)",
                 time.time() - building)
        state.heartbeat = heartbeat
        heartbeat.clocks = time_grad_sync(state.model.parts, heartbeat)
        outcome = train(state)
        heartbeat.phase("done")
    except (ConfigError, ShardChecksumError, HfWeightsError) as err:  # bad input only a rank
        log.error("rank %d failed: %s", ctx.rank, err)               # could see: one line
        if ctx.is_main:
            record_input_failure(run_dir, str(err))
        if wandb is not None:
            wandb.abandon()
        return "failed"
    except BaseException:
        log.exception("rank %d failed", ctx.rank)
        if wandb is not None:
            wandb.abandon()
        raise
    # Free DDP's reducer while the process group is alive: freeing it after destroy ran gloo's
    # destructor with the GIL held while a gloo thread waited for the GIL (a hang, seen here).
    del state
    gc.collect()
    teardown()
    return outcome


def record_input_failure(run_dir: Path, message: str) -> None:
    """The "failed" event `meshrun status` and the launcher show as the reason (one line)."""
    from conf.run_dir.metrics_rows import FAILED_EVENT
    from training.loggers import MetricsFile

    rows = MetricsFile(run_dir, resume_step=None)
    rows.write({"kind": "event", "event": FAILED_EVENT, "step": 0, "message": message})
    rows.close()
def start_heartbeat(run_dir: Path):
    """This rank's heartbeat (phase init) and its stack dump on signal, before any collective."""
    from training.dist import node_name
    from training.heartbeat import Heartbeat

    heartbeat = Heartbeat(run_dir, rank=int(os.environ.get("RANK", "0")), host=node_name())
    heartbeat.install_stack_dump(run_dir)
    heartbeat.write()
    return heartbeat


def preflight(spec, run_dir: Path, ctx, *, full_table: bool) -> None:
    """The checks; the bandwidth table in full for `meshrun preflight` (`full_table`), else
    only up to the first bandwidth-bound size (training.preflight.ENOUGH_MS)."""
    from training.dist import node_name
    from conf.run_dir.preflight_report import format_table
    from training.preflight import ENOUGH_MS, run_preflight

    report = run_preflight(store=None, rank=ctx.rank, world_size=ctx.world_size,
                           device=ctx.device, run_dir=run_dir if ctx.is_main else None,
                           timeout_s=spec.cluster.preflight_timeout_s,
                           max_bytes=spec.cluster.preflight_max_mib * 1024**2,
                           hostname=node_name(), enough_ms=None if full_table else ENOUGH_MS)
    if ctx.is_main:
        note = f"\n({report['bandwidth_note']})" if report["bandwidth_note"] else ""
        logging.getLogger("meshrun.preflight").info(
            "preflight passed: %d ranks on %d host(s)\n%s%s", ctx.world_size,
            len(set(report.get("hosts", {}).values())) or 1, format_table(report["bandwidth"]),
            note)


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    # A crash in native code (a segfault in a collective's thread) prints every thread's
    # Python stack into this rank's log instead of leaving only torchrun's exit signal.
    faulthandler.enable(all_threads=True)
    args = sys.argv[1:] if argv is None else argv
    preflight_only = PREFLIGHT_ONLY in args
    args = [a for a in args if a != PREFLIGHT_ONLY]
    if len(args) != 1 or not RunDir(args[0]).is_run_dir:
        sys.stderr.write("usage: python -m training <run_dir> [--preflight-only]\n")
        return 2
    outcome = record(run)(Path(args[0]).resolve(), preflight_only=preflight_only)
    # Everything is written and every rank passed the final barrier: leave without running
    # interpreter-exit destructors of torch's C++ objects, which can deadlock at teardown.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if outcome == "failed" else 0)
