"""Preflight checks run on every rank before training, so a broken cluster fails in seconds.

    hosts = wait_for_ranks(store, rank=r, world_size=n, hostname=h, timeout_s=60)  # store only
    check_all_reduce(device=device)                                                 # needs a group
    rows = bandwidth_table(device=device, iters=20, warmup=5, max_bytes=64 << 20)
    print(format_table(rows))

`run_preflight` runs all three and has rank 0 write `preflight.json` into the run dir. Before
training (`meshrun run`) the table stops at the first bandwidth-bound size (ENOUGH_MS and
LATENCY_MULTIPLE x the smallest size's time): from there on the time is bandwidth, not latency,
and larger sizes only repeat that number at a higher cost (64 MiB over gloo on 2 CPU ranks:
0.1-0.5 s per op, 0.6-1.5 s of start-up for the whole table; on GPUs no size takes 5 ms, so the
table stays whole). `meshrun preflight` measures every size up to cluster.preflight_max_mib.
`wait_for_ranks` needs only a `torch.distributed.Store` (TCPStore, FileStore, HashStore), so a
launcher can call it with its own store before `init_process_group`.
"""
from __future__ import annotations

import json
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from conf.run_dir.paths import RunDir
from conf.run_dir.preflight_report import KIB, MIB, format_size

DEFAULT_SIZES_BYTES = (4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, 1 * MIB, 4 * MIB, 16 * MIB,
                       64 * MIB)
ENOUGH_MS = 5.0
"""The table before training ends at the first size whose all-reduce takes this long and
LATENCY_MULTIPLE times the smallest size's (`bandwidth_table(enough_ms=...)`)."""
LATENCY_MULTIPLE = 10
"""The smallest size's time is the link's latency (plus noise: 3-5 ms, not 0.1 ms, with 4 ranks
on 2 busy cores); 10x it means latency is under a tenth of the time: the size is bandwidth-bound
and larger ones only repeat that bandwidth, at a higher cost."""
MIN_ROWS = 2
"""The fewest sizes a shortened table keeps: the link fit (parallel/cost/calibrate.py) needs 2."""
JOIN_HINT = ("Check that every node started its processes (scheduler/job logs for the missing "
             "ranks), that the rendezvous host (MASTER_ADDR:MASTER_PORT or the rdzv endpoint) is "
             "reachable from every node (firewall, hostname resolution), that every node was "
             "given the same world size (nnodes x nproc_per_node), and that no rank crashed at "
             "startup.")


class PreflightError(RuntimeError):
    """A preflight check failed; the message says what is wrong and what to check."""


def format_ranks(ranks: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    spans: list[list[int]] = []
    for r in sorted(ranks):
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _ranks_label(ranks: list[int]) -> str:
    return f"{'rank' if len(ranks) == 1 else 'ranks'} {format_ranks(ranks)}"


def ranks_by_host(hosts: dict[int, str]) -> dict[str, list[int]]:
    """rank -> host map inverted to host -> sorted ranks, hosts in order of their first rank."""
    out: dict[str, list[int]] = {}
    for rank in sorted(hosts):
        out.setdefault(hosts[rank], []).append(rank)
    return out


def _join_key(prefix: str, rank: int) -> str:
    return f"{prefix}/joined/{rank}"


def _read_joined(store: dist.Store, *, prefix: str, ranks: list[int]) -> dict[int, str]:
    """Hostnames of the given ranks, whose keys must already exist."""
    values = store.multi_get([_join_key(prefix, r) for r in ranks]) if ranks else []
    return {r: json.loads(bytes(v).decode())["hostname"] for r, v in zip(ranks, values)}


def _missing(store: dist.Store, *, prefix: str, world_size: int) -> list[int]:
    return [r for r in range(world_size) if not store.check([_join_key(prefix, r)])]


def join_timeout_message(*, missing: list[int], joined: dict[int, str], world_size: int,
                         timeout_s: float) -> str:
    """'ranks 2-3 of 4 never joined within 5 s (joined: ranks 0-1 on n1). Check ...'."""
    on_hosts = "; ".join(f"{_ranks_label(rs)} on {h}" for h, rs in ranks_by_host(joined).items())
    return (f"preflight: {_ranks_label(missing)} of {world_size} never joined within "
            f"{timeout_s:g} s (joined: {on_hosts or 'none'}). {JOIN_HINT}")


def wait_for_ranks(store: dist.Store, *, rank: int, world_size: int, hostname: str,
                   timeout_s: float, key_prefix: str = "preflight") -> dict[int, str]:
    """Announce this rank in `store`, wait until all `world_size` ranks did; rank -> hostname.

    Raises PreflightError naming the missing ranks (and where the others run) on timeout.
    """
    info = {"hostname": hostname, "pid": os.getpid(),
            "local_rank": int(os.environ.get("LOCAL_RANK", "-1"))}
    store.set(_join_key(key_prefix, rank), json.dumps(info))
    keys = [_join_key(key_prefix, r) for r in range(world_size)]
    deadline = time.monotonic() + timeout_s
    sleep_s = 0.01
    while not store.check(keys):  # one round trip for all keys
        if time.monotonic() >= deadline:
            missing = _missing(store, prefix=key_prefix, world_size=world_size)
            if missing:
                present = sorted(set(range(world_size)) - set(missing))
                joined = _read_joined(store, prefix=key_prefix, ranks=present)
                raise PreflightError(join_timeout_message(
                    missing=missing, joined=joined, world_size=world_size, timeout_s=timeout_s))
            break
        time.sleep(min(sleep_s, max(0.0, deadline - time.monotonic())))
        sleep_s = min(sleep_s * 2, 0.25)
    return _read_joined(store, prefix=key_prefix, ranks=list(range(world_size)))


def _mismatch(got: torch.Tensor, expected: float) -> str | None:
    bad = (got != expected).nonzero().flatten()
    if bad.numel() == 0:
        return None
    first = int(bad[0])
    return (f"{bad.numel()} of {got.numel()} elements wrong, first at index {first}: "
            f"expected {expected:g}, got {got[first].item():g}")


def check_all_reduce(*, device: torch.device, numel: int = 1 << 20) -> None:
    """all_reduce SUM of each rank's rank (1 element, then `numel` fp32) must be sum(range(n)).

    Integers below 2**24 are exact in fp32, so any difference is a real fault.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    expected = float(world * (world - 1) // 2)
    for name, t in (("scalar", torch.full((1,), rank, dtype=torch.float64, device=device)),
                    (f"{numel}-element fp32", torch.full((numel,), rank, dtype=torch.float32,
                                                         device=device))):
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        problem = _mismatch(t.cpu(), expected)
        if problem:
            raise PreflightError(
                f"preflight: all_reduce SUM of the {name} tensor on rank {rank} of {world} is "
                f"wrong ({problem}; expected = sum(range({world}))). A rank or link corrupts "
                f"collectives: check the interconnect (NCCL_DEBUG=INFO), drivers and the "
                f"{dist.get_backend()} backend settings.")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def iters_for(size_bytes: int, *, iters: int, warmup: int,
              scale_above_bytes: int = 1 * MIB) -> tuple[int, int]:
    """(iters, warmup) for one size: above 1 MiB, iters * 1 MiB / size (at least 3), 1 warmup."""
    if size_bytes <= scale_above_bytes:
        return iters, warmup
    return max(3, min(iters, iters * scale_above_bytes // size_bytes)), min(warmup, 1)


def _median_op_ms(*, size_bytes: int, device: torch.device, iters: int, warmup: int) -> float:
    """Median wall time of one all_reduce of `size_bytes` of fp32 on this rank."""
    t = torch.ones(max(1, size_bytes // 4), dtype=torch.float32, device=device)
    for _ in range(warmup):
        dist.all_reduce(t)
    _sync(device)
    dist.barrier()
    times_ms = []
    for _ in range(iters):
        start = time.perf_counter()
        dist.all_reduce(t)
        _sync(device)
        times_ms.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times_ms)


def bandwidth_table(*, device: torch.device, sizes_bytes: tuple[int, ...] = DEFAULT_SIZES_BYTES,
                    iters: int = 20, warmup: int = 3, max_bytes: int | None = None,
                    enough_ms: float | None = None,
                    latency_multiple: float = LATENCY_MULTIPLE) -> list[dict]:
    """all_reduce (SUM, fp32) timing per message size, identical on every rank.

    time_ms is the median per op on each rank, then the MAX over ranks. Bandwidths are in GB/s
    (1e9 bytes/s) as nccl-tests define them: algbw = size / time, busbw = algbw * 2(n-1)/n.
    Sizes above `max_bytes` are skipped; sizes above 1 MiB run proportionally fewer iterations.
    With `enough_ms`, the table ends at the first bandwidth-bound size (`bandwidth_bound`);
    every rank sees the same times, so every rank stops at the same size.
    """
    sizes = table_sizes(sizes_bytes, max_bytes=max_bytes)
    world = dist.get_world_size()
    rows = []
    for size in sizes:
        n, w = iters_for(size, iters=iters, warmup=warmup)
        local = _median_op_ms(size_bytes=size, device=device, iters=n, warmup=w)
        slowest = torch.tensor([local], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        time_ms = float(slowest.item())
        algbw = size / (time_ms * 1e-3) / 1e9 if time_ms > 0 else 0.0
        rows.append({"size_bytes": size, "time_ms": time_ms, "algbw_gbps": algbw,
                     "busbw_gbps": algbw * 2 * (world - 1) / world,
                     "iters": n})
        if enough_ms is not None and bandwidth_bound(rows, enough_ms=enough_ms,
                                                     latency_multiple=latency_multiple):
            break
    return rows


def table_sizes(sizes_bytes: tuple[int, ...], *, max_bytes: int | None) -> tuple[int, ...]:
    """The message sizes a table measures: those up to `max_bytes` (all when None)."""
    return tuple(s for s in sizes_bytes if max_bytes is None or s <= max_bytes)


def bandwidth_bound(rows: list[dict], *, enough_ms: float,
                    latency_multiple: float = LATENCY_MULTIPLE) -> bool:
    """Whether the last row ends a shortened table: MIN_ROWS rows or more, and its time_ms at
    least `enough_ms` and `latency_multiple` x the first (smallest) row's."""
    return len(rows) >= MIN_ROWS and rows[-1]["time_ms"] >= max(
        enough_ms, latency_multiple * rows[0]["time_ms"])


def shortened_note(rows: list[dict], *, sizes_bytes: tuple[int, ...], enough_ms: float) -> str:
    """Why the table ends where it does, when `enough_ms` cut it short ('' when it did not)."""
    if not rows or len(rows) == len(sizes_bytes):
        return ""
    last = rows[-1]
    return (f"sizes above {format_size(last['size_bytes'])} not measured: it took "
            f"{last['time_ms']:.1f} ms (>= {enough_ms:g} ms and {LATENCY_MULTIPLE}x "
            f"{format_size(rows[0]['size_bytes'])}'s {rows[0]['time_ms']:.2f} ms: "
            f"bandwidth-bound); `meshrun preflight` measures every size")


def _gather_hosts(*, hostname: str, world_size: int) -> dict[int, str]:
    """rank -> hostname through the process group (when no store was given)."""
    names: list[str | None] = [None] * world_size
    dist.all_gather_object(names, hostname)
    return {r: str(h) for r, h in enumerate(names)}


def write_report(report: dict, *, run_dir: Path) -> Path:
    """Write preflight.json atomically (temp file, then rename)."""
    path = RunDir(run_dir).preflight_file
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)
    return path


def run_preflight(*, store: dist.Store | None, rank: int, world_size: int, device: torch.device,
                  run_dir: Path | None, timeout_s: float = 120.0, max_bytes: int | None = None,
                  hostname: str | None = None, iters: int = 20, warmup: int = 3,
                  enough_ms: float | None = None) -> dict:
    """Join check (if `store`), all-reduce check, bandwidth table; rank 0 writes preflight.json.

    `enough_ms`: end the table at the first size that takes this long (see ENOUGH_MS); the
    report's "bandwidth_note" then says where and why.

    Needs an initialized process group. Every rank returns the same report, except that the
    elapsed times are its own.
    """
    hostname = hostname or socket.gethostname()
    start = time.perf_counter()
    if store is not None:
        hosts = wait_for_ranks(store, rank=rank, world_size=world_size, hostname=hostname,
                               timeout_s=timeout_s)
    else:
        hosts = _gather_hosts(hostname=hostname, world_size=world_size)
    join_s = time.perf_counter() - start
    check_all_reduce(device=device)
    rows = bandwidth_table(device=device, iters=iters, warmup=warmup, max_bytes=max_bytes,
                           enough_ms=enough_ms)
    wanted = table_sizes(DEFAULT_SIZES_BYTES, max_bytes=max_bytes)
    by_host = ranks_by_host(hosts)
    report = {
        "world_size": world_size,
        "backend": dist.get_backend(),
        "device": str(device),
        "torch_version": torch.__version__,
        "hosts": {str(r): h for r, h in sorted(hosts.items())},
        "ranks_per_host": {h: len(rs) for h, rs in by_host.items()},
        "ranks_by_host": {h: format_ranks(rs) for h, rs in by_host.items()},
        "join_check": {"passed": True, "via": "store" if store is not None else "process group",
                       "elapsed_s": round(join_s, 3)},
        "all_reduce_check": {"passed": True, "expected_sum": world_size * (world_size - 1) // 2},
        "bandwidth": rows,
        "bandwidth_note": (shortened_note(rows, sizes_bytes=wanted, enough_ms=enough_ms)
                           if enough_ms is not None else ""),
        "elapsed_s": round(time.perf_counter() - start, 3),
    }
    if rank == 0 and run_dir is not None:
        write_report(report, run_dir=run_dir)
    return report
