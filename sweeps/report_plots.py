"""The report's interactive plots: plotly figures rendered to HTML, plotly.js inlined once.

Hover shows the run and its value, a legend click hides a run (in both loss panels, one legend
group per run), a double click isolates it, and a slider smooths the train loss (an exponential
moving average, debiased as TensorBoard and W&B do). Nothing is fetched: the page carries
plotly.js itself (`plotly_bundle`), so the report stays one file that works offline.
"""
from __future__ import annotations

import math

import plotly.io as pio
from plotly.colors import qualitative
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from sweeps.compare import RunRecord
from sweeps.compare_cli import format_cell

MAX_CURVE_POINTS = 2000
NO_DATA_COLOR = "#8c959f"
PALETTE = (*qualitative.D3,  # tab10, for up to 10 runs
           "#511CFB", "#FB00D1", "#620042", "#FC0080", "#6C7C32", "#222A2A", "#1616A7",
           "#0D2A63", "#B68100", "#750D86", "#DA16FF", "#862A16", "#AF0038", "#00A08B")
"""One colour per run, the first 10 tab10's; runs 11-24 take plotly's Dark24 colours in the order
that keeps each next one farthest (CIELAB) from those before it: 20 runs stay as far apart as
tab10's closest pair, with no light/dark pairs of one hue (tab20's, hard to tell apart). Beyond
24 runs the colours repeat."""
BAR_METRICS = (("tokens_per_s", "Throughput after warm-up", "tokens/s (all ranks)", 1.0),
               ("mfu", "MFU after warm-up", "% of dense peak", 100.0),
               ("peak_mem_gib", "Peak memory", "GiB (max over ranks)", 1.0))
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}
LOSS_PLOT_ID = "loss-plot"
BARS_PLOT_ID = "bars-plot"


def run_colors(records: list[RunRecord]) -> dict[str, str]:
    """One colour per run, the same in every plot and in the table; grey without data."""
    with_data = [r for r in records if r.config]
    colors = {r.name: NO_DATA_COLOR for r in records}
    colors.update({r.name: PALETTE[i % len(PALETTE)].lower() for i, r in enumerate(with_data)})
    return colors


def plotly_bundle() -> str:
    """plotly.js itself, for one inline <script> in the page head."""
    return get_plotlyjs()


def _div(figure: dict, div_id: str) -> str:
    return pio.to_html(figure, include_plotlyjs=False, full_html=False, div_id=div_id,
                       config=PLOT_CONFIG, validate=False)


def _panels(traces: list[tuple[int, dict]], **subplots) -> tuple:
    """An empty plotly subplot grid (axes, titles; built and checked by plotly) and the figure
    dict its traces go into: (col, trace) pairs placed on their column's axes unchecked, which
    keeps a 12-run, 2000-step report fast to write."""
    fig = make_subplots(rows=1, **subplots)
    placed = [{**trace, "xaxis": f"x{col if col > 1 else ''}",
               "yaxis": f"y{col if col > 1 else ''}"} for col, trace in traces]
    return fig, placed


def _figure(fig, placed: list[dict]) -> dict:
    return {"data": placed, "layout": fig.to_dict()["layout"]}


def _thin(curve: tuple) -> tuple:
    """At most about MAX_CURVE_POINTS points, keeping the last one."""
    thinned = curve[::max(1, math.ceil(len(curve) / MAX_CURVE_POINTS))]
    return thinned if thinned[-1] == curve[-1] else thinned + (curve[-1],)


def loss_plot(records: list[RunRecord], *, colors: dict[str, str]) -> str:
    """Train loss per step (left, smoothable) and validation loss per eval (right), one legend
    entry per run that toggles both of its lines."""
    drawn = [r for r in records if r.train_curve or r.val_curve]
    if not drawn:
        return '<p class="empty">No run has logged a loss yet.</p>'
    traces = [(col, _loss_trace(record, _thin(curve), what=what, color=colors[record.name],
                                first=col == 1 or not record.train_curve))
              for record in drawn
              for col, curve, what in ((1, record.train_curve, "train"),
                                       (2, record.val_curve, "val")) if curve]
    fig, placed = _panels(traces, cols=2, shared_yaxes=True, horizontal_spacing=0.04,
                          subplot_titles=("Train loss per step", "Validation loss per eval"))
    fig.update_xaxes(title_text="step", rangemode="tozero")
    fig.update_yaxes(title_text="loss (cross-entropy, nats/token)", row=1, col=1)
    fig.update_layout(height=460, margin={"l": 60, "r": 20, "t": 40, "b": 50},
                      hovermode="closest", template="plotly_white",
                      legend={"title": {"text": "run (click: hide, double-click: only this)"},
                              "groupclick": "togglegroup"})
    return _div(_figure(fig, placed), LOSS_PLOT_ID)


def _loss_trace(record: RunRecord, curve: tuple, *, what: str, color: str, first: bool) -> dict:
    steps, losses = (list(v) for v in zip(*curve))
    trace = {"type": "scatter", "x": steps, "y": losses, "name": record.name,
             "legendgroup": record.name, "showlegend": first, "line": {"color": color},
             "meta": {"kind": what}}
    if what == "train":
        trace.update(mode="lines", line={"color": color, "width": 1.6}, customdata=losses,
                     hovertemplate="<b>%{fullData.name}</b><br>step %{x}<br>train loss "
                                   "%{y:.4f} (raw %{customdata:.4f})<extra></extra>")
    else:
        trace.update(mode="lines+markers", marker={"size": 6},
                     hovertemplate="<b>%{fullData.name}</b><br>step %{x}<br>val loss "
                                   "%{y:.4f}<extra></extra>")
    return trace


def bars_plot(records: list[RunRecord], *, colors: dict[str, str]) -> str:
    """Horizontal bars per run for tokens/s, MFU and peak memory; 'n/a' where a run has none."""
    if not records:
        return '<p class="empty">No runs.</p>'
    names = [r.name for r in records]
    traces, ranges = [], []
    for col, (key, title, unit, scale) in enumerate(BAR_METRICS, start=1):
        values = [_scaled(r.outcomes.get(key), scale) for r in records]
        shown = ["n/a" if v is None else format_cell(key, v / scale) for v in values]
        traces.append((col, {
            "type": "bar", "orientation": "h", "y": names, "x": [v or 0.0 for v in values],
            "text": shown, "textposition": "outside", "cliponaxis": False,
            "marker": {"color": [colors[n] for n in names]}, "showlegend": False, "name": title,
            "hovertemplate": f"<b>%{{y}}</b><br>{title}: %{{text}}<extra></extra>"}))
        ranges.append((col, unit, max((v for v in values if v), default=1.0)))
    fig, placed = _panels(traces, cols=len(BAR_METRICS), shared_yaxes=True,
                          horizontal_spacing=0.03,
                          subplot_titles=[title for _, title, _, _ in BAR_METRICS])
    for col, unit, top in ranges:
        fig.update_xaxes(title_text=unit, range=[0, top * 1.35], row=1, col=col)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_layout(height=140 + 30 * len(records), template="plotly_white",
                      margin={"l": 20, "r": 20, "t": 50, "b": 50})
    return _div(_figure(fig, placed), BARS_PLOT_ID)


def _scaled(value: object, scale: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) * scale


SMOOTHING_CONTROL = """<label class="smooth">Smoothing (EMA of train loss)
<input type="range" id="smoothing" min="0" max="0.99" step="0.01" value="0">
<output id="smoothing-value">0.00</output></label>"""

SMOOTHING_SCRIPT = """
function meshrunSmooth(raw, weight) {
  // Exponential moving average, debiased so the first points are not pulled toward 0.
  var out = [], last = 0, debias = 1;
  for (var i = 0; i < raw.length; i++) {
    last = last * weight + (1 - weight) * raw[i];
    debias *= weight;
    out.push(weight > 0 ? last / (1 - debias) : raw[i]);
  }
  return out;
}
(function () {
  var gd = document.getElementById("%(plot)s"), slider = document.getElementById("smoothing");
  if (!gd || !slider || !gd.data) { return; }
  var shown = document.getElementById("smoothing-value");
  slider.addEventListener("input", function () {
    var weight = Number(slider.value), ys = [], which = [];
    gd.data.forEach(function (trace, i) {
      if (trace.meta && trace.meta.kind === "train") {
        ys.push(meshrunSmooth(Array.from(trace.customdata), weight)); which.push(i);
      }
    });
    shown.textContent = weight.toFixed(2);
    if (which.length) { Plotly.restyle(gd, {y: ys}, which); }
  });
})();
""" % {"plot": LOSS_PLOT_ID}
