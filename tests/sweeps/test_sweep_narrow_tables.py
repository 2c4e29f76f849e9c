"""`meshrun sweep status` and `meshrun compare` at an 80-column terminal (COLUMNS=80): no line
is wider, and nothing a user reads is cut: each point's state, loss and MFU stay whole on its
row, long run names and run dirs fold onto more lines (read back whole here, column by
column), compare's other columns move to a second table led by the row number. Wide, each
is one table with one line per run (sweeps/narrow_table.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conf.run_dir.outcomes import mfu_after_warmup
from launcher.cli import main
from sweeps.compare import collect_runs
from sweeps.compare_cli import format_cell
from sweeps.expand import expand
from sweeps.spec_file import inline_sweep
from sweeps.state import SweepState
from tests.support.sweep_dirs import write_run

AXES = ["model=tiny", "optim.lr=1e-3,3e-3", "schedule.warmup_steps=0,10",
        "training.micro_batch_size=4"]
ROW = re.compile(r"\d+  ")
"""A line that starts a row: its number, then the gap to the next column."""
RAN = 3  # points 0..2 have run dirs (0 and 2 failed at step 12, 1 completed); 3 never ran


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("narrow") / "sweeps" / "lr-and-warmup"
    sweep = inline_sweep(AXES, name="lr-and-warmup")
    state = SweepState.load(root, name=sweep.name)
    for point in state.merge(expand(sweep))[:RAN]:
        run_dir = root / "runs" / f"learning-rate-and-warmup-point-{point.index}-20261202-101010"
        finished = point.index % 2 == 1
        write_run(run_dir, overrides=list(point.overrides[1:]), val_losses=[5.5, 4.8, 4.4],
                  steps=20 if finished else 12, finished=finished)
        state.add_attempt(point.index, run_dir, backend="local")
        state.finish_attempt(point.index, exit_status=0 if finished else 1)
    state.save()
    return root


def shown_mfu(sweep_dir: Path, index: int) -> str:
    """Point `index`'s MFU as every view shows it: the one after-warm-up mean of its rows
    (conf.run_dir.outcomes.mfu_after_warmup), not its last step's."""
    run_dir = next((sweep_dir / "runs").glob(f"*-point-{index}-*"))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return f"{100 * mfu_after_warmup(rows):.1f}%"


def lines_of(capsys, monkeypatch, columns: int, *argv: str) -> list[str]:
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(list(argv)) == 0
    return capsys.readouterr().out.splitlines()


def column(lines: list[str], header: str, *, until: str | None = None) -> list[str]:
    """The cells of one column of a box-less table, a folded cell joined back: the text
    under `header` (up to the column `until` starts), a row per line that starts a row."""
    head = next(i for i, line in enumerate(lines) if line.startswith("#  "))
    start = lines[head].index(header)
    end = lines[head].index(until) if until else None
    cells: list[str] = []
    for line in lines[head + 1:]:
        piece = line[start:end].strip()
        if ROW.match(line):
            cells.append(piece)
        elif cells and line.startswith(" ") and line.strip():
            cells[-1] += piece
        else:
            break
    return cells


@pytest.mark.parametrize("columns", [80, 200])
def test_sweep_status_keeps_state_loss_mfu_and_the_run_dir(sweep_dir, capsys, monkeypatch,
                                                           columns):
    lines = lines_of(capsys, monkeypatch, columns, "sweep", "status", str(sweep_dir))
    header = f"Sweep lr-and-warmup: {sweep_dir}"
    assert header in lines  # one soft-wrapped line, whatever its length: copied whole
    # the lines holding the sweep dir (the header, the retry command) are soft-wrapped
    assert all(len(line) <= columns for line in lines if str(sweep_dir) not in line), lines
    assert not any("…" in line for line in lines), lines
    rows = [line.split() for line in lines if ROW.match(line)]
    failed, completed = (shown_mfu(sweep_dir, index) for index in (0, 1))
    assert [r[:1] + r[3:7] for r in rows] == [
        ["0", "failed", "12/120", "5.1600", failed], ["1", "completed", "20/120", "4.8667",
                                                      completed],
        ["2", "failed", "12/120", "5.1600", failed], ["3", "missing", "-", "-", "-"]]
    assert column(lines, "run dir") == [
        f"learning-rate-and-warmup-point-{i}-20261202-101010" for i in range(RAN)] + ["-"]
    if columns == 200:
        assert len(rows) == len(lines) - 3 - 3  # title, 2 header lines; counts, retry (2)


@pytest.mark.parametrize("columns", [80, 200])
def test_compare_keeps_run_state_losses_and_mfu(sweep_dir, capsys, monkeypatch, columns):
    lines = lines_of(capsys, monkeypatch, columns, "compare", str(sweep_dir), "--no-html")
    assert all(len(line) <= columns for line in lines), lines
    assert not any("…" in line for line in lines), lines
    records = collect_runs(paths=[sweep_dir])
    wanted = [(r.name, str(r.state), format_cell("final_loss", r.value("final_loss")),
               format_cell("mfu", r.value("mfu"))) for r in records]
    if columns == 80:  # a first table of run, state, losses and MFU; the rest in a second
        assert column(lines, "run", until="state") == [name for name, *_ in wanted]
        rows = [line.split() for line in lines if ROW.match(line)][:len(records)]
        assert [(r[2], r[-2], r[-1]) for r in rows] == [tuple(w[1:]) for w in wanted]
        assert sum(line.startswith("#  ") for line in lines) == 2
    else:  # one table, a line per run
        rows = [line.split() for line in lines if line.lstrip().startswith("lr=")]
        assert [(r[0], r[1]) for r in rows] == [w[:2] for w in wanted]
