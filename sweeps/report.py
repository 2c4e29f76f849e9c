"""A self-contained HTML report of a comparison: table, loss curves, throughput bars, config diff.

One file, no network: the plots are plotly figures (sweeps/report_plots.py) with plotly.js inlined
in the page, the style and the few lines of click-to-sort script are inline too. Hover a line for
its run and value, click a legend entry to hide a run, smooth the train loss with the slider.
`report.html#sort=-mfu` opens sorted.
"""
from __future__ import annotations

import html
import time
from collections import Counter
from pathlib import Path
from string import Template

from launcher.output_file import write_file_atomically
from sweeps.compare import OUTCOMES, RunRecord, best_run, display, table_columns
from sweeps.compare_cli import format_cell
from sweeps.peak_marks import marked_cell, marked_runs, peak_note
from sweeps.report_plots import (SMOOTHING_CONTROL, SMOOTHING_SCRIPT, bars_plot, loss_plot,
                                 plotly_bundle, run_colors)


def write_report(*, records: list[RunRecord], keys: list[str], path: Path, title: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomically(path, render_report(records=records, keys=keys, title=title))
    return path


def render_report(*, records: list[RunRecord], keys: list[str], title: str) -> str:
    colors = run_colors(records)
    return PAGE.substitute(
        title=html.escape(title), summary=_summary(records),
        generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"), plotly_js=plotly_bundle(),
        table=_table(records, keys=keys, colors=colors), smoothing=SMOOTHING_CONTROL,
        loss_plot=loss_plot(records, colors=colors), bars_plot=bars_plot(records, colors=colors),
        smoothing_script=SMOOTHING_SCRIPT,
        config_diff=_config_diff(records, keys=keys, colors=colors))


# --- HTML pieces -------------------------------------------------------------------------------

def _summary(records: list[RunRecord]) -> str:
    states = Counter(r.state for r in records)
    parts = [f"{len(records)} run{'s' if len(records) != 1 else ''}",
             ", ".join(f"{n} {html.escape(s)}" for s, n in states.most_common())]
    best = best_run(records)
    if best is not None:
        parts.append(f"lowest validation loss: <b>{html.escape(best.name)}</b> "
                     f"({format_cell('best_val_loss', best.outcomes['best_val_loss'])})")
    note = peak_note(records)
    return " &middot; ".join(parts) + (f'<br><span class="peak-note">{html.escape(note)}</span>'
                                       if note else "")


def _dot(color: str) -> str:
    return f'<span class="dot" style="background:{color}"></span>'


def _table(records: list[RunRecord], *, keys: list[str], colors: dict[str, str]) -> str:
    columns = table_columns(keys, records)
    head = "".join(
        f'<th data-col="{html.escape(c)}" class="{_kind(c, keys)}" title="click to sort">'
        f"{html.escape(c)}</th>" for c in columns)
    best = best_run(records)
    marked = marked_runs(records)
    body = []
    for record in records:
        cells = []
        for column in columns:
            value = record.value(column)
            shown = html.escape(marked_cell(format_cell(column, value), name=record.name,
                                            column=column, marked=marked))
            if column == "run":
                shown = _dot(colors[record.name]) + shown
            mark = ' class="best"' if record is best and column == "best_val_loss" else ""
            cells.append(f'<td data-v="{html.escape(display(value))}"{mark}>{shown}</td>')
        body.append(f'<tr data-run="{html.escape(record.name)}" '
                    f'title="{html.escape(str(record.run_dir))}">{"".join(cells)}</tr>')
    return (f'<div class="wide"><table id="runs"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _kind(column: str, keys: list[str]) -> str:
    return "cfg" if column in keys else "out" if column in OUTCOMES else "label"


def _config_diff(records: list[RunRecord], *, keys: list[str], colors: dict[str, str]) -> str:
    """Per run: its overrides and the value of every differing key, unusual values marked."""
    configured = [r for r in records if r.config]
    common = {k: _usual(display(r.config.get(k)) for r in configured) for k in keys}
    items = []
    for record in records:
        chips = []
        for key in keys if record.config else ():
            value = display(record.config.get(key))
            odd = " odd" if common[key] is not None and value != common[key] else ""
            chips.append(f'<span class="chip{odd}"><span class="k">{html.escape(key)}</span> = '
                         f"{html.escape(value or '(absent)')}</span>")
        detail = "".join(chips) or _no_diff(record)
        overrides = " ".join(record.overrides)
        items.append(
            f'<div class="run-diff" data-run="{html.escape(record.name)}">'
            f"<h3>{_dot(colors[record.name])}{html.escape(record.name)} "
            f'<small>{html.escape(record.state)}</small></h3><div>{detail}</div>'
            f'<p class="overrides">overrides: <code>{html.escape(overrides or "(none)")}</code>'
            f'<br>run dir: <code>{html.escape(str(record.run_dir))}</code></p></div>')
    return "".join(items)


def _usual(values) -> str | None:
    """The value most runs share, if one clearly does (more than one run, no tie)."""
    ranked = Counter(values).most_common(2)
    if not ranked or ranked[0][1] < 2 or (len(ranked) > 1 and ranked[1][1] == ranked[0][1]):
        return None
    return ranked[0][0]


def _no_diff(record: RunRecord) -> str:
    why = "same config as the others" if record.config else "no config (run dir missing or unread)"
    return f'<span class="empty">{why}</span>'


PAGE = Template("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title>
<script>$plotly_js</script>
<style>
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px 32px;
       color: #1f2328; background: #fff; }
h1 { margin: 0 0 4px; font-size: 24px; } h2 { margin: 28px 0 8px; font-size: 18px; }
.meta { color: #57606a; margin: 0 0 16px; }
table#runs { border-collapse: collapse; font-variant-numeric: tabular-nums; }
#runs th, #runs td { padding: 4px 10px; border-bottom: 1px solid #d0d7de; white-space: nowrap; }
#runs th { cursor: pointer; position: sticky; top: 0; background: #f6f8fa; text-align: left;
           user-select: none; }
#runs th.cfg { background: #ddf4ff; } #runs td { text-align: right; }
#runs td:nth-child(-n+2) { text-align: left; }
#runs th[aria-sort=ascending]::after { content: " \\25B2"; }
#runs th[aria-sort=descending]::after { content: " \\25BC"; }
#runs tbody tr:hover { background: #f6f8fa; } td.best { color: #1a7f37; font-weight: 600; }
.dot { display: inline-block; width: 10px; height: 10px; border-radius: 50%;
       margin-right: 6px; vertical-align: baseline; }
.plot { max-width: 1400px; } .smooth { color: #57606a; font-size: 13px; }
.smooth input { vertical-align: middle; width: 220px; }
.run-diff { border: 1px solid #d0d7de; border-radius: 6px; padding: 6px 12px; margin: 8px 0; }
.run-diff h3 { margin: 4px 0; font-size: 15px; } .run-diff small { color: #57606a; }
.chip { display: inline-block; background: #f6f8fa; border: 1px solid #d0d7de;
        border-radius: 12px; padding: 1px 9px; margin: 2px 4px 2px 0; font-family: monospace; }
.chip.odd { background: #fff8c5; border-color: #d4a72c; } .chip .k { color: #0550ae; }
.overrides { color: #57606a; margin: 4px 0; } .empty { color: #8c959f; font-style: italic; }
.hint { color: #57606a; font-size: 12px; } .wide { overflow-x: auto; }
</style></head>
<body data-script="not run">
<h1>$title</h1>
<p class="meta">$summary &middot; generated $generated</p>
<h2>Runs</h2>
<p class="hint">Blue headers are the config keys that differ between runs. Click a header to sort
(again to reverse); open with <code>#sort=-mfu</code> to start sorted. <span id="js-status"></span></p>
$table
<h2>Loss</h2>
<p class="hint">Hover a line for its run and value; click a run in the legend to hide it
(double-click: show only it). $smoothing</p>
<div class="plot">$loss_plot</div>
<h2>Throughput, MFU and memory</h2>
<div class="plot">$bars_plot</div>
<h2>Config diff</h2>
<p class="hint">The differing keys of each run; a value unlike the one most runs share is highlighted.</p>
$config_diff
<script>
$smoothing_script
(function () {
  var table = document.getElementById("runs");
  var body = table.tBodies[0];
  var headers = Array.prototype.slice.call(table.tHead.rows[0].cells);
  function compare(a, b) {
    if (a === "" || b === "") { return (a === "") - (b === ""); }
    var x = Number(a), y = Number(b);
    return (!isNaN(x) && !isNaN(y)) ? x - y : a.localeCompare(b);
  }
  function sortBy(column, descending) {
    var index = headers.findIndex(function (h) { return h.dataset.col === column; });
    if (index < 0) { return false; }
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (r, s) {
      var a = r.cells[index].dataset.v, b = s.cells[index].dataset.v;
      var missing = (a === "") - (b === "");
      return missing || (descending ? -compare(a, b) : compare(a, b));
    });
    rows.forEach(function (r) { body.appendChild(r); });
    headers.forEach(function (h) { h.removeAttribute("aria-sort"); });
    headers[index].setAttribute("aria-sort", descending ? "descending" : "ascending");
    return true;
  }
  headers.forEach(function (h) {
    h.addEventListener("click", function () {
      sortBy(h.dataset.col, h.getAttribute("aria-sort") === "ascending");
    });
  });
  var wanted = /^#sort=(-?)(.+)$$/.exec(window.location.hash);
  if (wanted) { sortBy(decodeURIComponent(wanted[2]), wanted[1] === "-"); }
  document.getElementById("js-status").textContent = "Sorting is ready.";
  document.body.dataset.script = "ok";
})();
</script>
</body></html>
""")
