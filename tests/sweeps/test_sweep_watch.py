"""The local sweep's watch view: the live table from point states (rendered to a recording
console, no terminal needed), the ETA, the plain lines without a terminal, and the one line
--parallel N prints about how many points run at once."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from conf.spec import HostSpec
from sweeps.run_local import concurrency_note
from sweeps.watch import (PointProgress, SweepWatch, format_duration, sweep_eta_s,
                          watch_table)


def render(table, *, width: int = 100) -> str:
    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    console.print(table)
    return console.export_text()


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in re.split("[│┃]", line) if cell.strip()]


def fake_points() -> list[PointProgress]:
    return [PointProgress(index=0, name="lr0.001", steps=100, state="completed", step=100,
                          loss=2.3456, started_s=0.0, ended_s=60.0),
            PointProgress(index=1, name="lr0.003", steps=100, state="running", step=50,
                          loss=2.5, started_s=60.0),
            PointProgress(index=2, name="lr0.01", steps=100, state="failed", step=10,
                          loss=9.0, started_s=0.0, ended_s=5.0),
            PointProgress(index=3, name="lr0.03", steps=100)]


def test_table_shows_each_point_state_step_loss_and_the_sweep_eta() -> None:
    text = render(watch_table(fake_points(), elapsed_s=90.0, now_s=90.0, title="sweep: lrs"))
    lines = text.splitlines()
    assert lines[0].startswith("sweep: lrs")
    header = next(line for line in lines if "point" in line)
    assert cells(header) == ["#", "point", "state", "step", "loss", "time"]
    rows = {cells(line)[1]: cells(line)[2:] for line in lines if "│" in line}
    assert rows["lr0.001"] == ["completed", "100/100", "2.3456", "1:00"]
    assert rows["lr0.003"] == ["running", "50/100", "2.5000", "0:30"]
    assert rows["lr0.01"] == ["failed", "10/100", "9.0000", "0:05"]
    assert rows["lr0.03"] == ["pending", "-/100", "-", "-"]
    # done: 100 + 50 + 100 (a failed point is over) = 250 of 400 steps in 90 s -> 54 s left
    assert "2/4 done, 1 running, 1 failed, elapsed 1:30, ETA 0:54" in text


def test_eta_before_any_step_and_after_the_last() -> None:
    pending = [PointProgress(index=i, name=f"p{i}", steps=10) for i in range(3)]
    assert sweep_eta_s(pending, elapsed_s=5.0) is None
    assert "ETA -" in render(watch_table(pending, elapsed_s=5.0, now_s=5.0))
    ended = [PointProgress(index=i, name=f"p{i}", steps=10, state="completed", step=10)
             for i in range(3)]
    assert sweep_eta_s(ended, elapsed_s=5.0) == 0.0
    assert "3/3 done, 0 running, elapsed 0:05, ETA 0:00" in render(
        watch_table(ended, elapsed_s=5.0, now_s=5.0))
    assert [format_duration(s) for s in (None, 0, 59.6, 61, 3725)] == [
        "-", "0:00", "1:00", "1:01", "1:02:05"]


def test_a_big_sweep_shows_running_and_failed_points_first() -> None:
    points = [PointProgress(index=i, name=f"p{i}", steps=10) for i in range(40)]
    points[35].state, points[39].state = "running", "failed"
    text = render(watch_table(points, elapsed_s=1.0, now_s=1.0), width=80)
    assert " p35 " in text and " p39 " in text and "... 16 more" in text


def test_table_fits_a_narrow_terminal() -> None:
    text = render(watch_table(fake_points(), elapsed_s=90.0, now_s=90.0), width=60)
    assert all(len(line) <= 60 for line in text.splitlines())
    assert "completed" in text and "100/100" in text


def write_rows(run_dir: Path, rows: list[dict]) -> None:
    with open(run_dir / "metrics.jsonl", "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def test_watch_follows_metrics_and_prints_plain_lines_without_a_terminal(tmp_path) -> None:
    console = Console(record=True, width=120, color_system=None)
    assert not console.is_terminal
    points = [PointProgress(index=0, name="a", steps=4), PointProgress(index=1, name="b", steps=4)]
    with SweepWatch(console, points, live=False) as watch:
        watch.started(index=0, run_dir=tmp_path, n=1, total=2)
        write_rows(tmp_path, [{"kind": "train", "step": 3, "loss": 1.5},
                              {"kind": "eval", "step": 3, "val_loss": 1.7}])
        table = render(watch.render())
        watch.ended(index=0, status=0)
    assert console.export_text() == f"[1/2] point 0 a: {tmp_path}\n"
    assert "running" in table and "3/4" in table and "1.5000" in table
    assert (points[0].state, points[0].step, points[1].state) == ("completed", 3, "pending")


def test_live_watch_draws_the_table_on_a_terminal(tmp_path) -> None:
    console = Console(record=True, width=100, color_system=None, force_terminal=True)
    points = [PointProgress(index=0, name="a", steps=4), PointProgress(index=1, name="b", steps=4)]
    with SweepWatch(console, points, live=True, title="sweep: s") as watch:
        watch.started(index=0, run_dir=tmp_path, n=1, total=2)
        write_rows(tmp_path, [{"kind": "train", "step": 4, "loss": 1.25}])
        watch.ended(index=0, status=1)
    text = console.export_text()
    assert "[1/2]" not in text  # the table replaces the start lines
    assert "sweep: s" in text and "failed" in text and "1.2500" in text and "1/2 done" in text


def host(*, cpus: int = 2, gpus: int = 0) -> HostSpec:
    return HostSpec(gpu_name="H100" if gpus else "", gpu_count=gpus,
                    compute_capability=9.0 if gpus else 0.0, cpu_count=cpus)


def specs(*sizes: int) -> list:
    return [SimpleNamespace(world_size=size) for size in sizes]


@pytest.mark.parametrize(("machine", "parallel", "sizes", "line"), [
    (host(cpus=2), 2, (2, 2, 2), "--parallel 2: running one point at a time: two points need 4 "
                                 "of this machine's 2 CPU cores"),
    (host(cpus=2), 2, (1, 1, 1, 1), "--parallel 2: up to 2 points at once, 1 CPU thread(s) per "
                                    "rank"),
    (host(cpus=8), 4, (3, 3, 3, 3), "--parallel 4: at most 2 points at once: 3 points need 9 of "
                                    "this machine's 8 CPU cores"),
    (host(cpus=16, gpus=2), 2, (2, 2), "--parallel 2: running one point at a time: two points "
                                       "need 4 of this machine's 2 GPUs"),
    (host(cpus=16, gpus=8), 4, (2, 2, 2), "--parallel 4: up to 3 points at once"),
    (host(cpus=2), 2, (1,), "--parallel 2: only 1 point to run"),
])
def test_parallel_says_in_one_line_how_many_points_run_at_once(machine, parallel, sizes, line,
                                                               monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert concurrency_note(machine, parallel=parallel, specs=specs(*sizes)) == line
