"""Preflight checks: the join check over a store, the all-reduce check, the bandwidth table and
preflight.json. Two spawned launches (4 ranks with a store, 2 ranks without); the join timeout
and a corrupted all-reduce run in this process."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.support.spawn import run_on_ranks
from conf.run_dir.preflight_report import format_table
from training.preflight import (DEFAULT_SIZES_BYTES, MIN_ROWS, PreflightError, bandwidth_bound,
                                bandwidth_table, check_all_reduce, format_ranks, iters_for,
                                run_preflight, shortened_note, wait_for_ranks)

CPU = torch.device("cpu")
SMALL_SIZES_MAX = 1 << 20


def preflight_rank(*, rank: int, world_size: int, store_path: str | None, run_dir: str,
                   max_bytes: int) -> dict:
    """One rank: the whole preflight, with a separate FileStore like a launcher's own store."""
    store = dist.FileStore(store_path, world_size) if store_path else None
    hostname = f"n{1 + rank // 2}"  # two "nodes" of two ranks each
    return run_preflight(store=store, rank=rank, world_size=world_size, device=CPU,
                         run_dir=Path(run_dir), timeout_s=60, max_bytes=max_bytes,
                         hostname=hostname, iters=5, warmup=1)


@pytest.fixture(scope="module")
def four_rank_reports(tmp_path_factory) -> tuple[list[dict], Path]:
    root = tmp_path_factory.mktemp("preflight4")
    reports = run_on_ranks(preflight_rank, world_size=4, workdir=root, kwargs={
        "store_path": str(root / "preflight_store"), "run_dir": str(root),
        "max_bytes": 4 << 20})
    return reports, root


@pytest.mark.distributed
def test_join_check_maps_every_rank_to_its_host(four_rank_reports):
    reports, _ = four_rank_reports
    for report in reports:
        assert report["hosts"] == {"0": "n1", "1": "n1", "2": "n2", "3": "n2"}
        assert report["ranks_per_host"] == {"n1": 2, "n2": 2}
        assert report["join_check"]["passed"] and report["join_check"]["via"] == "store"
        assert report["all_reduce_check"] == {"passed": True, "expected_sum": 6}


@pytest.mark.distributed
def test_bandwidth_table_one_row_per_size_and_same_on_every_rank(four_rank_reports):
    reports, _ = four_rank_reports
    rows = reports[0]["bandwidth"]
    assert [r["size_bytes"] for r in rows] == [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20,
                                               4 << 20]
    for row in rows:
        assert row["time_ms"] > 0 and row["algbw_gbps"] > 0 and row["busbw_gbps"] > 0
        assert row["algbw_gbps"] == pytest.approx(row["size_bytes"] / row["time_ms"] / 1e6)
        assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 3 / 4)
    assert all(report["bandwidth"] == rows for report in reports)


@pytest.mark.distributed
def test_rank0_writes_preflight_json(four_rank_reports):
    reports, root = four_rank_reports
    written = json.loads((root / "preflight.json").read_text())
    assert written["world_size"] == 4 and written["backend"] == "gloo"
    assert written["torch_version"] == torch.__version__
    assert written["hosts"] == reports[0]["hosts"]
    assert written["bandwidth"] == reports[0]["bandwidth"]
    assert not list(root.glob("*.tmp"))


@pytest.mark.distributed
def test_two_ranks_without_store_gather_hosts_through_the_group(tmp_path):
    reports = run_on_ranks(preflight_rank, world_size=2, workdir=tmp_path, kwargs={
        "store_path": None, "run_dir": str(tmp_path), "max_bytes": SMALL_SIZES_MAX})
    assert reports[0]["hosts"] == reports[1]["hosts"] == {"0": "n1", "1": "n1"}
    assert reports[0]["join_check"]["via"] == "process group"
    assert len(reports[0]["bandwidth"]) == 5 and reports[0]["bandwidth"] == reports[1]["bandwidth"]
    assert json.loads((tmp_path / "preflight.json").read_text())["world_size"] == 2


def shortened_tables_rank(*, rank: int, world_size: int, run_dir: str) -> dict:
    """Tables that end at the first bandwidth-bound size, for `enough_ms` of 0, 0.3 ms and an
    hour; one that ends as soon as it may (no latency multiple); the report of a run."""
    tables = {ms: bandwidth_table(device=CPU, iters=5, warmup=1, max_bytes=SMALL_SIZES_MAX,
                                  enough_ms=ms) for ms in (0.0, 0.3, 3.6e6)}
    tables["at once"] = bandwidth_table(device=CPU, iters=5, warmup=1, enough_ms=0.0,
                                        latency_multiple=0.0)
    report = run_preflight(store=None, rank=rank, world_size=world_size, device=CPU,
                           run_dir=Path(run_dir), timeout_s=60, max_bytes=SMALL_SIZES_MAX,
                           iters=5, warmup=1, enough_ms=0.0)
    return {"tables": tables, "report": report}


@pytest.mark.distributed
def test_table_before_training_ends_at_the_first_bandwidth_bound_size(tmp_path):
    results = run_on_ranks(shortened_tables_rank, world_size=2, workdir=tmp_path,
                           kwargs={"run_dir": str(tmp_path)})
    tables = results[0]["tables"]
    assert all(r["tables"] == tables for r in results)  # every rank stopped at the same size
    every_size = [s for s in DEFAULT_SIZES_BYTES if s <= SMALL_SIZES_MAX]
    assert [r["size_bytes"] for r in tables.pop("at once")] == every_size[:MIN_ROWS]
    assert [r["size_bytes"] for r in tables[3.6e6]] == every_size
    for ms, rows in tables.items():  # ended at the first bound size, or ran through
        assert [r["size_bytes"] for r in rows] == every_size[:len(rows)]
        assert not any(bandwidth_bound(rows[:n], enough_ms=ms) for n in range(1, len(rows)))
        assert len(rows) == len(every_size) or bandwidth_bound(rows, enough_ms=ms)
    report = results[0]["report"]
    rows = report["bandwidth"]
    assert [r["size_bytes"] for r in rows] == every_size[:len(rows)]
    assert bool(report["bandwidth_note"]) == (len(rows) < len(every_size))
    assert json.loads((tmp_path / "preflight.json").read_text())["bandwidth_note"] == \
        report["bandwidth_note"]


def row(size_bytes: int, time_ms: float) -> dict:
    return {"size_bytes": size_bytes, "time_ms": time_ms}


def test_bandwidth_bound_needs_enough_ms_ten_latencies_and_two_rows():
    quiet = [row(4 << 10, 0.13), row(1 << 20, 0.6), row(4 << 20, 8.0)]  # 2 CPU ranks, idle
    assert [bandwidth_bound(quiet[:n], enough_ms=5.0) for n in (1, 2, 3)] == [False, False, True]
    busy = [row(4 << 10, 4.0), row(4 << 20, 23.0), row(16 << 20, 42.0)]  # 4 ranks, 2 busy cores
    assert [bandwidth_bound(busy[:n], enough_ms=5.0) for n in (2, 3)] == [False, True]
    assert not bandwidth_bound([row(4 << 10, 9.0)], enough_ms=5.0)  # one row is no table
    assert bandwidth_bound([row(4 << 10, 0.0), row(16 << 10, 0.0)], enough_ms=0.0)
    assert not bandwidth_bound(quiet[:2], enough_ms=0.5)  # 0.6 ms < 10 x 0.13 ms


def test_shortened_note_only_when_sizes_were_left_out():
    rows = [row(1 << 20, 0.6), row(4 << 20, 8.04)]
    sizes = (1 << 20, 4 << 20, 16 << 20)
    assert shortened_note(rows, sizes_bytes=sizes, enough_ms=5.0) == (
        "sizes above 4 MiB not measured: it took 8.0 ms (>= 5 ms and 10x 1 MiB's 0.60 ms: "
        "bandwidth-bound); `meshrun preflight` measures every size")
    assert shortened_note(rows, sizes_bytes=sizes[:2], enough_ms=5.0) == ""


def _stores(kind: str, tmp_path: Path) -> tuple[dist.Store, dist.Store]:
    """Two handles on one store, as two ranks would hold them."""
    if kind == "hash":
        store = dist.HashStore()
        return store, store
    path = str(tmp_path / "filestore")
    return dist.FileStore(path, 4), dist.FileStore(path, 4)


@pytest.mark.parametrize("kind", ["hash", "file"])
def test_join_timeout_names_the_missing_ranks(kind, tmp_path):
    store0, store1 = _stores(kind, tmp_path)
    other: list[BaseException] = []

    def rank1() -> None:
        try:
            wait_for_ranks(store1, rank=1, world_size=4, hostname="n1", timeout_s=1.0)
        except PreflightError as exc:
            other.append(exc)

    thread = threading.Thread(target=rank1)
    thread.start()
    start = time.monotonic()
    with pytest.raises(PreflightError) as caught:
        wait_for_ranks(store0, rank=0, world_size=4, hostname="n1", timeout_s=1.0)
    elapsed = time.monotonic() - start
    thread.join(timeout=10)
    message = str(caught.value)
    assert 1.0 <= elapsed < 3.0
    assert "ranks 2-3 of 4 never joined" in message
    assert "joined: ranks 0-1 on n1" in message and "MASTER_ADDR" in message
    assert len(other) == 1 and "ranks 2-3" in str(other[0])


def test_join_passes_when_all_ranks_arrive_in_threads():
    store = dist.HashStore()
    results: dict[int, dict[int, str]] = {}

    def join(rank: int) -> None:
        results[rank] = wait_for_ranks(store, rank=rank, world_size=4,
                                       hostname=f"h{rank % 2}", timeout_s=10)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert results == {r: {0: "h0", 1: "h1", 2: "h0", 3: "h1"} for r in range(4)}


def test_corrupted_all_reduce_fails_with_expected_and_got(one_rank_group, monkeypatch):
    check_all_reduce(device=CPU)  # the honest collective passes
    real_all_reduce = dist.all_reduce

    def corrupting_all_reduce(tensor, *args, **kwargs):
        work = real_all_reduce(tensor, *args, **kwargs)
        if tensor.numel() > 1:
            tensor[12345] += 2.0  # one flipped value, as a bad link would leave
        return work

    monkeypatch.setattr(dist, "all_reduce", corrupting_all_reduce)
    with pytest.raises(PreflightError) as caught:
        check_all_reduce(device=CPU)
    message = str(caught.value)
    assert "1 of 1048576 elements wrong, first at index 12345" in message
    assert "expected 0, got 2" in message


def test_format_table_and_helpers():
    rows = [{"size_bytes": 4096, "time_ms": 0.5, "algbw_gbps": 0.008192, "busbw_gbps": 0.012},
            {"size_bytes": 64 << 20, "time_ms": 170.4, "algbw_gbps": 0.394, "busbw_gbps": 0.591}]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["size", "time_ms", "algbw_GB/s", "busbw_GB/s"]
    assert lines[2].split() == ["64", "MiB", "170.400", "0.394", "0.591"]
    assert len({len(line) for line in lines}) == 1  # right-aligned columns
    assert format_ranks([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert iters_for(1 << 20, iters=20, warmup=3) == (20, 3)
    assert iters_for(64 << 20, iters=20, warmup=3) == (3, 1)
