"""`meshrun compare <sweep dir | run dirs...>`: a table of what differs and how each run did.

    meshrun compare sweeps/lr-sweep                     # table + sweeps/lr-sweep/report.html
    meshrun compare runs/a runs/b runs/c --html cmp.html
    meshrun compare runs/                              # every run dir directly under runs/
    meshrun compare SWEEP --sort best_val_loss --filter 'mfu>0.3' --filter model.name=tiny
    meshrun compare SWEEP --sort=-tokens_per_s --csv - # descending: write --sort=-COL with '='

Columns: run, state, the config keys whose values differ between the runs (dotted, as in
spec.json), then final_val_loss, best_val_loss, final_loss, tokens_per_s, mfu (after warm-up),
peak_flops (what MFU divides by; `*` marks runs whose peak differs, MFU not comparable),
peak_mem_gib, steps_done, wall_s. --sort and --filter accept any of these or any config key.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from conf.errors import ProblemList
from conf.run_dir.paths import RunDir
from launcher.output_file import check_output_file, write_file_atomically
from sweeps.peak_marks import marked_cell, marked_runs, peak_note
from sweeps.narrow_table import (column_width, fits_the_terminal, pack_columns, print_fitted,
                                  whole_width, wrapped_header)
from sweeps.compare import (OUTCOMES, RunRecord, best_run, collect_runs, differing_keys,
                            display, is_sweep_dir, select_runs,
                            table_columns, table_rows)

REPORT_FILE = "report.html"
STATE_STYLES = {"completed": "green", "preflight passed": "green", "missing": "red",
                "failed": "red", "out of memory": "red", "timed out": "red", "cancelled": "red"}


def register_compare(subparsers) -> None:
    """Add `compare` to the meshrun parser; its handler is `run_compare(args, console)`."""
    doc = __doc__ or ""
    parser = subparsers.add_parser(
        "compare", help="compare runs: differing config keys, losses, throughput, HTML report",
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path,
                        help="a sweep dir (with points.json), run dirs, or a folder of run dirs")
    parser.add_argument("--sort", default="", metavar="COL",
                        help="sort by a column; --sort=-COL for descending (missing values last)")
    parser.add_argument("--filter", action="append", default=[], metavar="EXPR", dest="filters",
                        help="keep runs where KEY=VALUE, KEY!=VALUE (string form, or equal as "
                             "numbers: optim.lr=1e-3 matches 0.001), KEY<N, KEY<=N, KEY>N, KEY>=N; "
                             "repeat to require all")
    parser.add_argument("--csv", metavar="FILE", help="write the rows as CSV ('-' for stdout)")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON ('-' for stdout)")
    parser.add_argument("--html", metavar="FILE", type=Path,
                        help=f"write the HTML report here (default: <sweep dir>/{REPORT_FILE} "
                             "when given one sweep dir)")
    parser.add_argument("--no-html", action="store_true", help="write no HTML report")
    parser.set_defaults(handler=run_compare)


def run_compare(args: argparse.Namespace, console: Console) -> int:
    check_paths(args.paths)
    check_output_files(args)
    records = select_runs(collect_runs(paths=args.paths), filters=args.filters, sort=args.sort)
    keys = differing_keys(records)
    rows = table_rows(records, keys=keys)
    to_stdout = "-" in (args.csv, args.json)
    shown = Console(stderr=True) if to_stdout else console
    print_comparison(records, keys=keys, title=_title(args.paths), console=shown)
    if note := peak_note(records):
        shown.print(note, markup=False, highlight=False, soft_wrap=True)
    if args.csv:
        _write(args.csv, rows_to_csv(rows, columns=[*table_columns(keys, records), "run_dir"]),
               shown)
    if args.json:
        _write(args.json, rows_to_json(rows), shown)
    html = _html_path(args)
    if html is not None:
        from sweeps.report import write_report

        write_report(records=records, keys=keys, path=html, title=_title(args.paths))
        shown.print(f"report: {html}")
    return 0


def check_paths(paths: list[Path]) -> None:
    """Each path exists and holds something to compare (a sweep dir, a run dir, or a folder
    of run dirs); else exit 2 naming it, before anything is written."""
    problems = ProblemList()
    for path in paths:
        path = Path(path)
        if not path.exists():
            problems.add(str(path), "", "does not exist", "give a sweep dir, a run dir or a "
                         "folder of run dirs")
        elif not path.is_dir():
            problems.add(str(path), "", "is a file, not a folder",
                         "give a sweep dir, a run dir or a folder of run dirs")
        elif not (is_sweep_dir(path) or RunDir(path).is_run_dir
                  or any(RunDir(d).is_run_dir for d in path.iterdir())):
            problems.add(str(path), "", "holds no run to compare (no points.json, no "
                         "spec.json, no run dir in it)",
                         "give a sweep dir, a run dir or a folder of run dirs")
    problems.raise_if_any("Nothing to compare")


def check_output_files(args: argparse.Namespace) -> None:
    """--csv, --json and --html can be written, before anything is read or written."""
    for flag, target in (("--csv", args.csv), ("--json", args.json)):
        if target and str(target) != "-":
            check_output_file(flag, target)
    if args.html:
        check_output_file("--html", args.html, make_folder=True)


def _title(paths: list[Path]) -> str:
    if len(paths) == 1 and is_sweep_dir(paths[0]):
        return f"Sweep {paths[0].resolve().name}"
    return f"Comparison of {len(paths)} path{'s' if len(paths) != 1 else ''}"


def _html_path(args: argparse.Namespace) -> Path | None:
    if args.no_html:
        return None
    if args.html:
        return args.html
    if len(args.paths) == 1 and is_sweep_dir(args.paths[0]):
        return args.paths[0] / REPORT_FILE
    return None


def _write(target: str, text: str, console: Console) -> None:
    if target == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_file_atomically(target, text)
    console.print(f"wrote {target}")


def rows_to_json(rows: list[dict]) -> str:
    """Strict JSON: a NaN or infinite number (a diverged loss) becomes null."""
    plain = [{k: None if isinstance(v, float) and not math.isfinite(v) else v
              for k, v in row.items()} for row in rows]
    return json.dumps(plain, indent=2, default=str) + "\n"


def rows_to_csv(rows: list[dict], *, columns: list[str]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([display(row.get(c)) for c in columns])
    return out.getvalue()


def print_comparison(records: list[RunRecord], *, keys: list[str], title: str,
                     console: Console) -> None:
    """The whole table when it fits (or, in a pipe or file with no COLUMNS, always: rows
    stay whole lines); else, at the terminal's width, several tables led by the row number:
    the first holds run, state, losses and MFU, the others the rest (sweeps/narrow_table.py)."""
    table = build_table(records, keys=keys, title=title)
    if whole_width(console, table) > console.width and fits_the_terminal(console):
        for n, part in enumerate(narrow_tables(records, keys=keys, title=title,
                                               width=console.width)):
            console.print(*([""] if n else []), part)
    else:
        print_fitted(table, console)


FIRST_PART = ("run", "state", "final_val_loss", "best_val_loss", "final_loss", "mfu")
"""What the first of several narrow tables shows: which run, how it ended, how well."""
ROW_NUMBER = "#"


def narrow_tables(records: list[RunRecord], *, keys: list[str], title: str,
                  width: int) -> list[Table]:
    """The comparison as tables no wider than `width`, each led by the row number."""
    columns = table_columns(keys, records)
    rest = [c for c in columns if c not in FIRST_PART]
    marked = marked_runs(records)
    cells = {c: [marked_cell(format_cell(c, r.value(c)), name=r.name, column=c, marked=marked)
                 for r in records] for c in columns}
    cells[ROW_NUMBER] = [str(i) for i in range(1, len(records) + 1)]
    widths = {c: column_width(c, cells[c]) for c in (ROW_NUMBER, *columns)}
    widths["run"] = min(widths["run"], max(width // 4, 8))  # folded: the rest stay whole
    first = {c: widths[c] for c in (ROW_NUMBER, *FIRST_PART)}
    groups = pack_columns(first, width=10_000, lead=ROW_NUMBER)
    groups += pack_columns({c: widths[c] for c in (ROW_NUMBER, *rest)}, width=width,
                           lead=ROW_NUMBER)
    best = best_run(records)
    parts = []
    for n, group in enumerate(groups):
        part = Table(title=f"{title}: {len(records)} run{'s' if len(records) != 1 else ''}"
                     if n == 0 else None, title_justify="left", box=None, pad_edge=False,
                     header_style="bold")
        for column in group:
            folded = column == "run"
            part.add_column(wrapped_header(column, widths[column]), no_wrap=not folded,
                            overflow="fold", min_width=None if folded else widths[column],
                            justify="right" if column in (*OUTCOMES, ROW_NUMBER) else "left",
                            style="cyan" if column in keys else "bold" if folded else "")
        for i, record in enumerate(records):
            row = [Text(cells[c][i]) for c in group]
            if "state" in group:
                row[group.index("state")].stylize(STATE_STYLES.get(record.state, "yellow"))
            if record is best and "best_val_loss" in group:
                row[group.index("best_val_loss")].stylize("bold green")
            part.add_row(*row)
        parts.append(part)
    return parts


def build_table(records: list[RunRecord], *, keys: list[str], title: str) -> Table:
    """Headers are the column names --sort/--filter take; a narrow terminal cuts headers first."""
    table = Table(title=f"{title}: {len(records)} run{'s' if len(records) != 1 else ''}",
                  title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1))
    columns = table_columns(keys, records)
    marked = marked_runs(records)
    cells = [[Text(marked_cell(format_cell(c, r.value(c)), name=r.name, column=c, marked=marked))
              for c in columns] for r in records]
    for index, column in enumerate(columns):
        widest = max((len(row[index]) for row in cells), default=1)
        table.add_column(column, min_width=widest, no_wrap=True,
                         justify="right" if column in OUTCOMES else "left",
                         style="cyan" if column in keys else "bold" if column == "run" else "")
    best = best_run(records)
    for record, row in zip(records, cells):
        row[1].stylize(STATE_STYLES.get(record.state, "yellow"))
        if record is best:
            row[columns.index("best_val_loss")].stylize("bold green")
        table.add_row(*row)
    return table


def format_cell(key: str, value: object) -> str:
    """How the table and the HTML report show a value (CSV/JSON keep full precision)."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return display(value)
    if key == "mfu":
        return f"{value:.1%}"
    if key == "peak_flops":
        return f"{value / 1e9:,.1f}G"
    if key == "tokens_per_s":
        return f"{value:,.0f}"
    if key in ("final_val_loss", "best_val_loss", "final_loss"):
        return f"{value:.4f}"
    if key in ("peak_mem_gib", "wall_s"):
        return f"{value:.2f}"
    return f"{value:g}" if isinstance(value, float) else str(value)

