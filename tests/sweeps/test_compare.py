"""`meshrun compare`: collecting runs, the config diff, sort, filter, CSV/JSON and the HTML report.

Run dirs are built by hand: spec.json from a real resolved spec, metrics.jsonl and summary.json
written the way the training loop writes them.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from conf.errors import ConfigError
from sweeps.compare import collect_runs, differing_keys, select_runs, table_rows
from sweeps.compare_cli import register_compare
from sweeps.report import render_report
from sweeps.report_plots import plotly_bundle
from tests.support.sweep_dirs import POINTS, write_run, write_sweep

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    return write_sweep(tmp_path_factory.mktemp("sweep"))


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="meshrun")
    register_compare(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["compare", *argv])
    return args.handler(args, Console(file=io.StringIO(), width=200))


def names(records) -> list[str]:
    return [r.name for r in records]


def test_collects_points_and_diffs_only_meaningful_keys(sweep):
    records = collect_runs(paths=[sweep])
    assert names(records) == [p[0] for p in POINTS]
    assert [r.state for r in records] == ["completed", "completed", "running", "missing"]
    assert records[0].run_dir == sweep / "runs" / "lr-1e-3"  # relative to the sweep dir
    assert records[1].run_dir == sweep / "runs" / "lr-3e-3"  # absolute
    # name, runs_dir and host.cpu_count differ too, but carry no meaning
    assert differing_keys(records) == ["optim.lr", "training.steps"]
    assert records[0].config["optim.lr"] == 1e-3 and records[3].config == {}
    # ... though the resolved specs differ in more: auto warmup and the derived W&B tags
    assert len({r.config["schedule.warmup_steps"] for r in records[:3]}) == 2
    assert len({str(r.config["logging.wandb_tags"]) for r in records[:3]}) == 3


def test_without_config_yaml_derived_tags_are_still_no_difference(sweep, tmp_path):
    import shutil

    for name in ("lr-1e-3", "lr-3e-3"):
        shutil.copytree(sweep / "runs" / name, tmp_path / name)
        (tmp_path / name / "config.yaml").unlink()
    records = collect_runs(paths=[tmp_path])
    assert differing_keys(records) == ["optim.lr"]


def test_outcomes_from_summary_or_metrics(sweep):
    done, _, running, missing = collect_runs(paths=[sweep])
    assert done.outcomes["best_val_loss"] == 4.4 and done.outcomes["tokens_per_s"] == 12345.0
    assert running.outcomes["steps_done"] == 15
    assert running.outcomes["final_val_loss"] == 4.5
    assert running.outcomes["final_loss"] == pytest.approx(5.6 - 15 * 0.1 * 1.0 / 2)
    # after warm-up: the first 10% of train rows (1 of 15) are left out of the mean
    assert running.outcomes["tokens_per_s"] == pytest.approx(1000.0 * sum(range(2, 16)) / 14)
    assert running.outcomes["peak_mem_gib"] == pytest.approx(0.65)
    assert all(v is None for v in missing.outcomes.values()) and missing.state == "missing"


def test_a_line_being_written_is_no_crash(tmp_path):
    run_dir = tmp_path / "live"
    write_run(run_dir, overrides=[], val_losses=[5.5, 5.0], steps=12, finished=False)
    with (run_dir / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"kind": "train", "step": 13, "lo')  # the writer is mid-line
    (record,) = collect_runs(paths=[run_dir])
    assert record.state in ("running", "unknown") and record.config["optim.lr"] > 0
    assert record.train_curve[-1][0] == 12 and len(record.val_curve) == 2


def test_sort_missing_values_last_either_way(sweep):
    records = collect_runs(paths=[sweep])
    up = select_runs(records, filters=[], sort="best_val_loss")
    assert names(up) == ["lr-3e-3", "lr-1e-3", "lr-1e-2-long", "lr-3e-2"]
    down = select_runs(records, filters=[], sort="-best_val_loss")
    assert names(down) == ["lr-1e-2-long", "lr-1e-3", "lr-3e-3", "lr-3e-2"]
    assert names(select_runs(records, filters=[], sort="-optim.lr"))[0] == "lr-1e-2-long"
    assert names(select_runs(records, filters=[], sort="run")) == sorted(names(records))


def test_filters(sweep):
    records = collect_runs(paths=[sweep])
    assert names(select_runs(records, filters=["optim.lr=0.001"], sort="")) == ["lr-1e-3"]
    assert names(select_runs(records, filters=["optim.lr=1e-3"], sort="")) == ["lr-1e-3"]
    assert names(select_runs(records, filters=["best_val_loss<4.45"], sort="")) == \
        ["lr-1e-3", "lr-3e-3"]
    assert names(select_runs(records, filters=["state!=missing", "training.steps<=40"],
                             sort="")) == ["lr-1e-2-long"]
    assert names(select_runs(records, filters=["state=completed"], sort="-optim.lr")) == \
        ["lr-3e-3", "lr-1e-3"]


def test_bad_sort_and_filters_reported_together(sweep):
    records = collect_runs(paths=[sweep])
    with pytest.raises(ConfigError) as err:
        select_runs(records, filters=["nokey=1", "mfu>fast", "junk"], sort="-bogus")
    text = str(err.value)
    assert "4 problems" in text
    for part in ("'nokey'", "needs a number", "is not KEY=VALUE", "'bogus'"):
        assert part in text


def test_csv_and_json_hold_the_same_rows(sweep, tmp_path):
    out_csv, out_json = tmp_path / "runs.csv", tmp_path / "runs.json"
    assert run_cli(str(sweep), "--sort=best_val_loss", "--csv", str(out_csv),
                   "--json", str(out_json), "--no-html") == 0
    rows = list(csv.DictReader(out_csv.open()))
    data = json.loads(out_json.read_text())
    assert [r["run"] for r in rows] == [r["run"] for r in data] == \
        ["lr-3e-3", "lr-1e-3", "lr-1e-2-long", "lr-3e-2"]
    assert list(rows[0]) == ["run", "state", "optim.lr", "training.steps", "final_val_loss",
                             "best_val_loss", "final_loss", "tokens_per_s", "mfu",
                             "peak_flops", "peak_mem_gib", "steps_done", "wall_s", "run_dir"]
    assert data[0]["optim.lr"] == 0.003 and rows[0]["optim.lr"] == "0.003"
    assert rows[3]["state"] == "missing" and rows[3]["best_val_loss"] == ""
    assert data[3]["best_val_loss"] is None
    assert not (sweep / "report.html").exists()


def test_csv_to_stdout_is_only_csv(sweep, capsys):
    assert run_cli(str(sweep), "--csv", "-", "--filter", "state=completed", "--no-html") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("run,state,optim.lr,") and len(lines) == 3


def test_run_dirs_missing_ones_and_a_folder_of_runs(sweep, tmp_path):
    runs = sweep / "runs"
    records = collect_runs(paths=[runs / "lr-1e-3", tmp_path / "gone", runs])
    assert names(records) == ["lr-1e-3", "gone", "lr-1e-2-long", "lr-1e-3", "lr-3e-3"]
    assert records[1].state == "missing"
    rows = table_rows(records, keys=differing_keys(records))
    assert rows[1]["final_val_loss"] is None and rows[0]["optim.lr"] == 0.001


def test_default_report_in_the_sweep_dir(sweep, tmp_path):
    copy = Path(shutil.copytree(sweep, tmp_path / "sweep"))
    assert run_cli(str(copy)) == 0
    page = (copy / "report.html").read_text()
    for name, *_ in POINTS:
        assert f'data-run="{name}"' in page
    assert 'id="loss-plot"' in page and 'id="bars-plot"' in page and "Config diff" in page
    assert "optim.lr" in page and "training.steps" in page


def test_report_is_self_contained(sweep):
    records = collect_runs(paths=[sweep])
    page = render_report(records=records, keys=differing_keys(records), title="t <&>")
    assert "<title>t &lt;&amp;&gt;</title>" in page
    own = page.replace(plotly_bundle(), "")  # plotly.js, inlined; it names URLs it never loads
    urls = set(re.findall(r"https?://[^\"'\s<>)]+", own))
    assert urls <= {"https://plot.ly"}, urls  # plotly's config default; no link shows it
    for external in ("<link", "src=", "@import"):
        assert external not in own
    assert 'data-col="logging.wandb_tags"' not in page  # derived from the varied keys


def test_compare_never_imports_torch(sweep, tmp_path):
    code = ("import sys, argparse, io; from rich.console import Console;"
            "from sweeps.compare_cli import register_compare;"
            "p = argparse.ArgumentParser(); register_compare(p.add_subparsers());"
            f"a = p.parse_args(['compare', {str(sweep)!r}, '--html', {str(tmp_path / 'r.html')!r}]);"
            "a.handler(a, Console(file=io.StringIO()));"
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
