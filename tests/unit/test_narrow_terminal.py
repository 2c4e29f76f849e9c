"""At an 80-column terminal (COLUMNS=80) nothing a user needs is cut: `meshrun status` keeps the
run dir whole on one soft-wrapped line (a user copies it), the plan's rank table keeps its rank
column (only the group lists wrap), and wide terminals show the same things on one line each.
The progress line's MFU at 80 columns: tests/unit/test_progress_bar.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conf.run_dir.paths import RunDir
from launcher.cli import main

BIG_LAYOUT = ["parallel=4d", "model=llama3_70b", "cluster=slurm", "cluster.nodes=128",
              "cluster.gpus_per_node=8", "cluster.gpu_name=H100", "data=synthetic",
              "parallel.tp=8", "parallel.pp=8", "parallel.cp=2"]  # 1024 ranks, long group lists


def cli(capsys, monkeypatch, columns: int, *argv: str) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(list(argv)) == 0
    return capsys.readouterr().out


@pytest.fixture
def long_run_dir(tmp_path: Path) -> Path:
    """A paused run dir whose path is longer than 80 characters."""
    run_dir = tmp_path / ("experiments-of-a-team-with-long-names" * 2) / "tiny-20260101-000000"
    metrics = RunDir(run_dir).metrics_file
    metrics.parent.mkdir(parents=True)
    rows = [{"kind": "train", "step": 5, "loss": 3.2, "tokens_per_s": 100.0, "mfu": 0.01},
            {"kind": "event", "event": "paused", "step": 5}]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    RunDir(run_dir).spec_file.write_text("{}")  # marks a run dir; status does not read it
    assert len(str(run_dir)) > 80
    return run_dir


@pytest.mark.parametrize("columns", [80, 200])
def test_status_keeps_the_run_dir_whole(long_run_dir, capsys, monkeypatch, columns):
    lines = cli(capsys, monkeypatch, columns, "status", str(long_run_dir)).splitlines()
    assert f"run dir: {long_run_dir}" in lines
    assert f"paused at step 5; continue with: meshrun resume {long_run_dir}" in lines
    assert all("…" not in line for line in lines), lines
    assert any(line.startswith("│ MFU ") and "1.0%" in line for line in lines), lines


def rank_rows(out: str) -> dict[str, list[str]]:
    """The rank table's rows that start a rank (a rank's group lists may wrap onto more)."""
    table = out[out.index("Ranks ("):]
    rows = [[c.strip() for c in line.rstrip()[1:-1].split("│")]
            for line in table.splitlines() if line.startswith("│")]
    return {r[0]: r for r in rows if r[0]}


@pytest.mark.parametrize("columns", [80, 200])
def test_plan_rank_table_keeps_its_rank_column(capsys, monkeypatch, columns):
    out = cli(capsys, monkeypatch, columns, "plan", *BIG_LAYOUT)
    header = next(line for line in out[out.index("Ranks ("):].splitlines()
                  if line.startswith("┃"))
    assert header.split("┃")[1].strip() == "rank", header
    rows = rank_rows(out)
    assert list(rows) == [str(r) for r in range(16)], rows.keys()
    assert rows["5"][1] == "0,0,0,5"  # coordinates whole
    assert all(len(line) <= columns for line in out.splitlines())
    if columns == 200:  # wide: every group list on one line
        assert rows["5"][2:6] == ["0-7", "5,21,..,117", "5,133,..,901", "5,13"]
