"""A self-contained HTML report of a comparison: table, loss curves, throughput bars, config diff.

No external assets and no network: plots are inline SVG from matplotlib (no pyplot, no display), the
style and the few lines of click-to-sort script are inline. `report.html#sort=-mfu` opens sorted.
"""
from __future__ import annotations

import html
import io
import math
import re
import time
from collections import Counter
from pathlib import Path
from string import Template

from matplotlib import colormaps, rc_context
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, MaxNLocator

from sweeps.compare import OUTCOMES, RunRecord, best_run, display, table_columns
from sweeps.compare_cli import format_cell

MAX_CURVE_POINTS = 2000
NO_DATA_COLOR = "#8c959f"
BAR_METRICS = (("tokens_per_s", "Throughput after warm-up", "tokens/s (all ranks)", 1.0),
               ("mfu", "MFU after warm-up", "% of dense peak", 100.0),
               ("peak_mem_gib", "Peak memory", "GiB (max over ranks)", 1.0))


def write_report(*, records: list[RunRecord], keys: list[str], path: Path, title: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report(records=records, keys=keys, title=title))
    return path


def render_report(*, records: list[RunRecord], keys: list[str], title: str) -> str:
    colors = run_colors(records)
    return PAGE.substitute(
        title=html.escape(title), summary=_summary(records),
        generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        table=_table(records, keys=keys, colors=colors),
        loss_plot=loss_svg(records, colors=colors), bars_plot=bars_svg(records, colors=colors),
        config_diff=_config_diff(records, keys=keys, colors=colors))


def run_colors(records: list[RunRecord]) -> dict[str, str]:
    """One readable color per run, the same in every plot and in the table; grey without data."""
    with_data = [r for r in records if r.config]
    cmap = colormaps["tab10" if len(with_data) <= 10 else "tab20"]
    colors = {r.name: NO_DATA_COLOR for r in records}
    colors.update({r.name: to_hex(cmap(i % cmap.N)) for i, r in enumerate(with_data)})
    return colors


# --- plots -------------------------------------------------------------------------------------

def _figure(*, ncols: int, figsize: tuple, sharey: bool = False) -> tuple:
    """A Figure without pyplot: no global backend or figure registry is touched."""
    fig = Figure(figsize=figsize, layout="constrained")
    return fig, fig.subplots(ncols=ncols, sharey=sharey)


def _svg(fig: Figure) -> str:
    buf = io.StringIO()
    with rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return re.sub(r"<metadata>.*?</metadata>", "", text[text.index("<svg"):], flags=re.S)


def _thin(curve: tuple) -> tuple:
    """At most about MAX_CURVE_POINTS points, keeping the last one."""
    thinned = curve[::max(1, math.ceil(len(curve) / MAX_CURVE_POINTS))]
    return thinned if thinned[-1] == curve[-1] else thinned + (curve[-1],)


def loss_svg(records: list[RunRecord], *, colors: dict[str, str]) -> str:
    """Train loss per step (left) and validation loss per eval (right), one color per run."""
    drawn = [r for r in records if r.train_curve or r.val_curve]
    if not drawn:
        return '<p class="empty">No run has logged a loss yet.</p>'
    fig, (train_ax, val_ax) = _figure(ncols=2, figsize=(12, 4.6), sharey=True)
    for record in drawn:
        color = colors[record.name]
        if record.train_curve:
            steps, losses = zip(*_thin(record.train_curve))
            train_ax.plot(steps, losses, color=color, linewidth=1.4, label=record.name)
        if record.val_curve:
            steps, losses = zip(*_thin(record.val_curve))
            val_ax.plot(steps, losses, color=color, linewidth=1.6, marker="o", markersize=4,
                        label=None if record.train_curve else record.name)
    for ax, what in ((train_ax, "Train loss"), (val_ax, "Validation loss")):
        ax.set_title(f"{what} per step")
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    train_ax.set_ylabel("loss (cross-entropy, nats/token)")
    fig.legend(loc="outside right upper", title="run", fontsize="small")
    return _svg(fig)


def bars_svg(records: list[RunRecord], *, colors: dict[str, str]) -> str:
    """Horizontal bars per run for tokens/s, MFU and peak memory; 'n/a' where a run has none."""
    if not records:
        return '<p class="empty">No runs.</p>'
    names = [r.name for r in records]
    fig, axes = _figure(ncols=len(BAR_METRICS), sharey=True,
                        figsize=(12, 1.4 + 0.38 * len(records)))
    for ax, (key, title, unit, scale) in zip(axes, BAR_METRICS):
        values = [_scaled(r.outcomes.get(key), scale) for r in records]
        ax.barh(names, [v or 0.0 for v in values], color=[colors[n] for n in names])
        top = max((v for v in values if v), default=1.0)
        for y, value in enumerate(values):
            text = "n/a" if value is None else format_cell(key, value / scale)
            ax.text((value or 0.0) + top * 0.02, y, text, va="center", fontsize="small")
        ax.set_xlim(0, top * 1.3)
        ax.set_title(title)
        ax.set_xlabel(unit)
        if key == "tokens_per_s":
            ax.xaxis.set_major_formatter(EngFormatter(sep=""))
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.grid(axis="x", alpha=0.3)
    axes[0].invert_yaxis()
    return _svg(fig)


def _scaled(value: object, scale: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) * scale


# --- HTML pieces -------------------------------------------------------------------------------

def _summary(records: list[RunRecord]) -> str:
    states = Counter(r.state for r in records)
    parts = [f"{len(records)} run{'s' if len(records) != 1 else ''}",
             ", ".join(f"{n} {html.escape(s)}" for s, n in states.most_common())]
    best = best_run(records)
    if best is not None:
        parts.append(f"lowest validation loss: <b>{html.escape(best.name)}</b> "
                     f"({format_cell('best_val_loss', best.outcomes['best_val_loss'])})")
    return " &middot; ".join(parts)


def _dot(color: str) -> str:
    return f'<span class="dot" style="background:{color}"></span>'


def _table(records: list[RunRecord], *, keys: list[str], colors: dict[str, str]) -> str:
    columns = table_columns(keys)
    head = "".join(
        f'<th data-col="{html.escape(c)}" class="{_kind(c, keys)}" title="click to sort">'
        f"{html.escape(c)}</th>" for c in columns)
    best = best_run(records)
    body = []
    for record in records:
        cells = []
        for column in columns:
            value = record.value(column)
            shown = html.escape(format_cell(column, value))
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
.plot svg { max-width: 100%; height: auto; }
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
<div class="plot">$loss_plot</div>
<h2>Throughput, MFU and memory</h2>
<div class="plot">$bars_plot</div>
<h2>Config diff</h2>
<p class="hint">The differing keys of each run; a value unlike the one most runs share is highlighted.</p>
$config_diff
<script>
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
