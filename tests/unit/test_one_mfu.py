"""One MFU per run: summary.json (and so the end-of-run table and W&B's summary), `meshrun
compare`, report.html, `meshrun status` and `meshrun sweep status` show the same number
(conf.run_dir.outcomes.mfu_after_warmup), finished or not; and a run whose peak differs from
the others' is marked in compare and the report (sweeps/peak_marks.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from conf.run_dir.outcomes import mfu_after_warmup, outcomes_from_rows, peak_of
from conf.run_dir.paths import RunDir
from launcher.views.run_status import print_status, run_status
from sweeps.compare import collect_runs
from sweeps.compare_cli import build_table, format_cell
from sweeps.peak_marks import marked_runs, peak_note
from sweeps.report import render_report
from sweeps.state import SweepState
from sweeps.track import point_status, status_table
from tests.support.sweep_dirs import write_run

GF = 1e9
PEAKS = {"a": 130 * GF, "b": 130 * GF, "c": 60 * GF}


def _sweep(tmp_path: Path) -> Path:
    """Three runs: a and b finished (summary.json written by the real summarize), c running;
    c's peak differs. Step MFU rises with the step, so the last step's differs from the mean."""
    from training.loggers import wandb_summary
    from training.summary_json import summarize, write_summary

    sweep_dir = tmp_path / "sweep"
    points = []
    for index, name in enumerate(PEAKS):
        run_dir = sweep_dir / "runs" / name
        write_run(run_dir, overrides=[f"optim.lr={index + 1}e-3"], val_losses=[5.5, 4.5],
                  steps=20, finished=False)
        with open(RunDir(run_dir).metrics_file, "a") as f:
            f.write(json.dumps({"kind": "peak", "step": 0, "peak_flops": PEAKS[name],
                                "source": f"test peak {name}", "time": 99.0}) + "\n")
        if name != "c":
            summary = summarize(run_dir, peak_source=f"test peak {name}", last_checkpoint="",
                                export_dir="")
            write_summary(run_dir, summary)
            assert wandb_summary(summary)["train/mfu"] == summary["mfu"]  # W&B: one MFU
        points.append({"index": index, "name": name, "values": {"optim.lr": str(index + 1)},
                       "overrides": [], "run_dir": f"runs/{name}",
                       "attempts": [{"run_dir": f"runs/{name}", "exit_status": 0}]})
    (sweep_dir / "points.json").write_text(json.dumps({"points": points}))
    return sweep_dir


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    return _sweep(tmp_path_factory.mktemp("one_mfu"))


def test_every_view_shows_the_mfu_after_warm_up(sweep_dir):
    state = SweepState(sweep_dir, json.loads((sweep_dir / "points.json").read_text()))
    records = {r.name: r for r in collect_runs(paths=[sweep_dir])}
    for record in state.records:
        run_dir = sweep_dir / record["run_dir"]
        rows = RunDir(run_dir).read_rows()
        expected = mfu_after_warmup(rows)
        last_step = [r for r in rows if r.get("kind") == "train"][-1]["mfu"]
        assert expected is not None and expected != pytest.approx(last_step)
        summary = RunDir(run_dir).read_summary()
        if summary is not None:
            assert summary["mfu"] == expected
        assert outcomes_from_rows(rows)["mfu"] == expected
        assert records[record["name"]].outcomes["mfu"] == expected  # compare, report
        assert run_status(run_dir)["mfu"] == expected  # meshrun status
        row = point_status(state, record, runner_alive=False)
        assert row["mfu"] == expected  # meshrun sweep status
        shown = format_cell("mfu", expected)
        console = Console(width=200, record=True)
        console.print(status_table([row], title="t"))
        print_status(run_status(run_dir), console)
        text = console.export_text()
        assert text.count(shown) == 2 and format_cell("mfu", last_step) not in text


def test_runs_with_another_peak_are_marked_in_compare_and_the_report(sweep_dir):
    records = collect_runs(paths=[sweep_dir])
    assert [r.outcomes["peak_flops"] for r in records] == list(PEAKS.values())
    assert marked_runs(records) == {"c"}
    note = peak_note(records)
    assert "2 different peaks" in note and "60.0" in note and "130.0" in note
    console = Console(width=300, record=True)
    console.print(build_table(records, keys=["optim.lr"], title="t"))
    lines = {line.split()[0]: line for line in console.export_text().splitlines()
             if line.split() and line.split()[0] in PEAKS}
    assert "60.0G *" in lines["c"] and "130.0G *" not in lines["a"] + lines["b"]
    page = render_report(records=records, keys=["optim.lr"], title="t")
    assert "60.0G *" in page and "2 different peaks" in page


def test_runs_with_one_peak_are_not_marked(sweep_dir):
    records = [r for r in collect_runs(paths=[sweep_dir]) if r.name != "c"]
    assert marked_runs(records) == set() and peak_note(records) == ""


def test_the_newest_legs_peak_is_the_runs_peak():
    rows = [{"kind": "peak", "step": 0, "peak_flops": 1.0, "source": "first"},
            {"kind": "resume", "step": 10},
            {"kind": "peak", "step": 10, "peak_flops": 2.0, "source": "second"}]
    assert peak_of(rows) == {"peak_flops": 2.0, "peak_source": "second"}
    assert peak_of([]) == {} and outcomes_from_rows([])["peak_flops"] is None
