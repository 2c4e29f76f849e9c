"""Process-group setup and teardown for one rank started by torchrun."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from training import flight_recorder


OWN_STORE_ENV = "MESHRUN_OWN_STORE"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device_kind: str, *, join_timeout_s: float,
                     init_timeout_s: float | None = None) -> RankContext:
    """Join the process group: NCCL on CUDA, gloo on CPU.

    Under torchrun the agent's store already saw every rank join (env://). A Slurm task
    (MESHRUN_OWN_STORE=1) brings its own TCPStore on MASTER_ADDR:MASTER_PORT, and rank 0
    names the ranks that never arrived instead of waiting forever. `init_timeout_s` bounds
    every collective until `set_collective_timeout` (after the first step) replaces it.
    """
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if device_kind == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    backend = "nccl" if device_kind == "cuda" else "gloo"
    kwargs = {"device_id": device} if backend == "nccl" else {}
    if init_timeout_s:
        kwargs["timeout"] = timedelta(seconds=init_timeout_s)
    if not dist.is_initialized():
        flight_recorder.enable()
        if os.environ.get(OWN_STORE_ENV) == "1" and world > 1:
            store = _joined_store(rank=rank, world=world, timeout_s=join_timeout_s)
            kwargs["store"] = store
        dist.init_process_group(backend=backend, rank=rank, world_size=world, **kwargs)
    return RankContext(rank=rank, local_rank=local_rank, world_size=world, device=device)


def set_collective_timeout(timeout_s: float) -> None:
    """The process group's timeout for training collectives (torchtitan's train timeout)."""
    if dist.is_initialized():
        dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout_s))


def node_name() -> str:
    """The Slurm node name when under Slurm (several slurmd may share one host), else hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _joined_store(*, rank: int, world: int, timeout_s: float) -> dist.Store:
    from training.preflight import PreflightError, wait_for_ranks

    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    try:
        store = dist.TCPStore(host, port, world_size=world, is_master=rank == 0,
                              timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    except (RuntimeError, OSError) as err:
        raise PreflightError(
            f"rank {rank} on {node_name()} could not reach the rendezvous store at "
            f"{host}:{port} within {timeout_s:.0f} s ({err}). Check that rank 0's node is up "
            "and that cluster.rdzv_host/rdzv_port are reachable from every node.") from None
    wait_for_ranks(store, rank=rank, world_size=world, hostname=node_name(),
                   timeout_s=timeout_s)
    return store


def teardown() -> None:
    """Barrier, then destroy: without the barrier ~1 run in 8 aborted at teardown on gloo."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_reduce_max(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()
