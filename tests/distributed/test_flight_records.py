"""torch's flight recorder through meshrun's pieces, on 2 real gloo ranks: with
training/flight_recorder.py's buffer on, a rank answers the watchdog's request file
(conf/run_dir/heartbeats.py) with its record, and the report's lines (conf/run_dir/
flight_dumps.py) name the rank that never entered the collective its peer waits in."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from conf.run_dir.flight_dumps import flight_lines, read_flight_dumps
from conf.run_dir.heartbeats import flight_dump_file, request_flight_dumps
from tests.support.spawn import run_on_ranks
from training.flight_recorder import BUFFER_ENV, FlightDumper

pytestmark = pytest.mark.distributed


def _rank_one_lags(rank: int, world_size: int, run_dir: str) -> int:
    """Both ranks enter 2 all-reduces; rank 0 enters a 3rd (async) that rank 1 joins only
    after both answered the request: the dumps show rank 1 one collective behind."""
    t = torch.ones(4)
    for _ in range(2):
        dist.all_reduce(t)
    dumper = FlightDumper(Path(run_dir), rank)
    (Path(run_dir) / f"ready.{rank}").touch()
    pending = dist.all_reduce(t, async_op=True) if rank == 0 else None
    if rank == 0:
        _wait_for(Path(run_dir) / "ready.1")
        time.sleep(0.05)  # a request newer than both dumpers' start, by the file's mtime
        request_flight_dumps(run_dir)
    deadline = time.monotonic() + 30
    while not flight_dump_file(run_dir, rank).exists():
        assert time.monotonic() < deadline, "no request seen"
        dumper.poll()
        time.sleep(0.01)
    if rank == 1:
        _wait_for(flight_dump_file(run_dir, 0))
        dist.all_reduce(t)
    else:
        pending.wait()
    return int(t[0].item())


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def test_flight_records_name_the_rank_behind(tmp_path, monkeypatch):
    monkeypatch.setenv(BUFFER_ENV, "100")  # the spawned ranks create their group with it
    (tmp_path / "logs").mkdir()
    sums = run_on_ranks(_rank_one_lags, world_size=2, workdir=tmp_path, timeout_s=120,
                        kwargs={"run_dir": str(tmp_path)})
    assert sums == [8, 8]  # 1 -> 2 -> 4 -> 8: the three all-reduces happened on both
    dumps = read_flight_dumps(tmp_path, 2, since=0.0)
    assert sorted(dumps) == [0, 1]
    lines = flight_lines(dumps, 2)
    assert "2 of 2 ranks answered" in lines[0], lines
    (group,) = [line for line in lines[1:] if "behind" in line]
    assert "rank 0 #3 gloo:all_reduce" in group and "rank 1 #2 gloo:all_reduce" in group, lines
    assert group.endswith("behind: rank(s) 1"), lines


def test_no_request_no_dump_and_an_earlier_legs_request_is_no_request(tmp_path):
    (tmp_path / "logs").mkdir()
    FlightDumper(tmp_path, 0).poll()
    assert not flight_dump_file(tmp_path, 0).exists()
    request_flight_dumps(tmp_path)  # left by an earlier leg, before this rank started
    FlightDumper(tmp_path, 0).poll()
    assert not flight_dump_file(tmp_path, 0).exists()
    assert flight_lines({}, 2) == ["flight records: none written (no rank could answer)"]
