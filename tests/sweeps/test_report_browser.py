"""The compare report in a real headless browser (Debian's chromium): it renders, every run is in
the DOM, the inline script ran without errors and sorted the table, and a screenshot is taken.
The plots are driven the way a user would: a copy of the report gets a small driver script that
hovers a point (plotly's own Fx.hover), clicks a legend entry (mouse events on its toggle), moves
the smoothing slider, lists every resource the page loaded, and writes what it saw as JSON into the
DOM, which --dump-dom hands back.

Skipped when chromium is missing, except under CI, where it fails with the install command.
Set MESHRUN_SCREENSHOT_DIR to keep the screenshot (report.png) for a person to look at.
"""
from __future__ import annotations

import html
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from sweeps.compare import collect_runs, differing_keys
from sweeps.report import write_report
from sweeps.report_plots import LOSS_PLOT_ID, plotly_bundle
from tests.support.sweep_dirs import POINTS, write_sweep
from tests.support.tracker_uis import chromium_or_skip

CATCH_ERRORS = """<script>window.meshrunErrors = [];
window.addEventListener("error", function (e) { window.meshrunErrors.push(String(e.message)); });
</script>"""
DRIVER = """<script>
(function () {
  var out = {}, gd = document.getElementById("%(plot)s"), run = "%(run)s";
  function finish() {
    out.errors = window.meshrunErrors;
    out.resources = performance.getEntriesByType("resource").map(function (e) { return e.name; });
    var pre = document.createElement("pre");
    pre.id = "test-result"; pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  function lines() {  // drawn line paths per run name
    var drawn = {};
    gd.querySelectorAll(".scatterlayer .trace").forEach(function (g) {
      var name = gd._fullData[g.__data__[0].trace.index].name;
      drawn[name] = (drawn[name] || 0) + g.querySelectorAll("path.js-line").length;
    });
    return drawn;
  }
  try {
    var train = gd._fullData.findIndex(function (t) { return t.name === run && t.meta.kind === "train"; });
    out.point = {x: gd._fullData[train].x[%(point)d], y: gd._fullData[train].y[%(point)d]};
    Plotly.Fx.hover(gd, [{curveNumber: train, pointNumber: %(point)d}], "xy");
    out.hover = Array.from(gd.querySelectorAll(".hoverlayer .hovertext")).map(function (n) {
      return Array.from(n.querySelectorAll("tspan.line")).map(function (l) { return l.textContent; });
    });
    Plotly.Fx.unhover(gd);
    out.linesBefore = lines();
    var item = Array.from(gd.querySelectorAll(".legend .traces")).find(function (g) {
      return g.querySelector("text.legendtext").textContent === run;
    });
    var toggle = item.querySelector("rect.legendtoggle"), box = toggle.getBoundingClientRect();
    var at = {bubbles: true, cancelable: true, view: window, button: 0,
              clientX: box.left + 20, clientY: box.top + box.height / 2};
    toggle.dispatchEvent(new MouseEvent("mousedown", at));
    toggle.dispatchEvent(new MouseEvent("mouseup", at));
    setTimeout(function () {  // plotly waits out a possible double click first
      out.visible = gd._fullData.map(function (t) { return [t.name, t.meta.kind, t.visible]; });
      out.linesAfter = lines();
      var slider = document.getElementById("smoothing");
      slider.value = "0.9"; slider.dispatchEvent(new Event("input"));
      var other = gd.data.findIndex(function (t) { return t.name !== run && t.meta.kind === "train"; });
      out.smoothed = {run: gd.data[other].name, y: Array.from(gd.data[other].y),
                      raw: Array.from(gd.data[other].customdata),
                      shown: document.getElementById("smoothing-value").textContent};
      finish();
    }, 1000);
  } catch (e) { out.exception = String(e.stack || e); finish(); }
})();
</script>"""

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing resolves: the page must need nothing
         "--virtual-time-budget=10000", "--enable-logging=stderr", "--v=0")
SCRIPT_ERROR = re.compile(r"Uncaught|ERROR:CONSOLE")  # chromium logs page errors so


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_or_skip()


def open_page(chromium: str, url: str, *, profile: Path, screenshot: Path | None = None
              ) -> subprocess.CompletedProcess:
    """One headless launch: the DOM after load on stdout, the browser's log on stderr."""
    extra = [f"--screenshot={screenshot}", "--window-size=1400,2000"] if screenshot else []
    return subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", *extra,
                           "--dump-dom", url], capture_output=True, text=True, timeout=120)


def test_detector_sees_a_script_error(chromium, tmp_path):
    """The control: a page whose script throws is caught by the same check."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><p>x</p><script>noSuchFunction();</script>"
                    "</body></html>")
    result = open_page(chromium, page.as_uri(), profile=tmp_path / "profile")
    assert result.returncode == 0, result.stderr[-2000:]
    assert SCRIPT_ERROR.search(result.stderr), result.stderr[-2000:]


def test_report_renders_sorts_and_has_no_script_errors(chromium, tmp_path):
    sweep = write_sweep(tmp_path / "sweep")
    records = collect_runs(paths=[sweep])
    report = write_report(records=records, keys=differing_keys(records),
                          path=sweep / "report.html", title="Sweep lr")
    keep = os.environ.get("MESHRUN_SCREENSHOT_DIR")
    shot = Path(keep) / "report.png" if keep else tmp_path / "report.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    result = open_page(chromium, f"{report.as_uri()}#sort=-best_val_loss",
                       profile=tmp_path / "profile", screenshot=shot)
    assert result.returncode == 0, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if SCRIPT_ERROR.search(line)]
    assert not errors, errors
    dom = result.stdout
    assert 'data-script="ok"' in dom, "the inline script did not run to its end"
    assert "Sorting is ready." in dom
    body = dom[dom.index("<tbody>"):dom.index("</tbody>")]
    order = re.findall(r'<tr data-run="([^"]+)"', body)
    # descending best validation loss, the run without one last
    assert order == ["lr-1e-2-long", "lr-1e-3", "lr-3e-3", "lr-3e-2"]
    assert 'aria-sort="descending"' in dom
    for name, *_ in POINTS:
        assert dom.count(f'data-run="{name}"') == 2  # its table row and its config diff
    assert dom.count("<svg") >= 2
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def drive(chromium: str, report: Path, *, run: str, point: int, tmp_path: Path,
          extra_head: str = "") -> tuple[dict, str]:
    """Open a copy of the report with the error catcher first and the driver last; the JSON the
    driver wrote, and chromium's log."""
    page = report.read_text().replace("<head>", "<head>" + CATCH_ERRORS + extra_head, 1)
    head, tail = page.rsplit("</body>", 1)
    driven = report.with_name("driven.html")
    driven.write_text(head + DRIVER % {"plot": LOSS_PLOT_ID, "run": run, "point": point}
                      + "</body>" + tail)
    result = open_page(chromium, driven.as_uri(), profile=tmp_path / "profile-driven")
    assert result.returncode == 0, result.stderr[-2000:]
    found = re.search(r'<pre id="test-result">(.*?)</pre>', result.stdout, flags=re.S)
    assert found, f"the driver wrote no result; chromium said:\n{result.stderr[-3000:]}"
    return json.loads(html.unescape(found.group(1))), result.stderr


def ema(values: list[float], weight: float) -> list[float]:
    """The debiased exponential moving average the smoothing slider is meant to draw."""
    out, last = [], 0.0
    for n, value in enumerate(values, start=1):
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight ** n))
    return out


@pytest.fixture
def report(tmp_path) -> Path:
    sweep = write_sweep(tmp_path / "sweep")
    records = collect_runs(paths=[sweep])
    return write_report(records=records, keys=differing_keys(records),
                        path=sweep / "report.html", title="Sweep lr")


def test_report_is_one_file_that_loads_nothing(report):
    page = report.read_text()
    assert page.count(plotly_bundle()) == 1, "plotly.js is inlined exactly once"
    own = page.replace(plotly_bundle(), "")
    assert not re.findall(r"<(?:script|link|img|iframe|embed|object)\b[^>]*\b(?:src|href)=", own)
    assert "@import" not in own and "url(" not in own


def test_hover_toggle_and_smoothing_in_the_browser(chromium, report, tmp_path):
    run, point = "lr-3e-3", 5
    seen, log = drive(chromium, report, run=run, point=point, tmp_path=tmp_path)
    assert "exception" not in seen, seen["exception"]
    assert seen["errors"] == [] and not SCRIPT_ERROR.search(log), (seen["errors"], log[-2000:])
    assert seen["resources"] == [], "the page fetched something"
    # hover: one label naming the run, with the step and the value of that point
    x, y = seen["point"]["x"], seen["point"]["y"]
    assert seen["hover"] == [[run, f"step {x}", f"train loss {y:.4f} (raw {y:.4f})"]]
    # a legend click hides the run's train and val lines, and only those
    assert seen["linesBefore"][run] == 2 and seen["linesAfter"].get(run, 0) == 0
    others = {n: k for n, k in seen["linesBefore"].items() if n != run}
    assert others and {n: seen["linesAfter"].get(n) for n in others} == others
    for name, kind, visible in seen["visible"]:
        assert visible == ("legendonly" if name == run else True), (name, kind, visible)
    # the slider draws the debiased EMA of the raw train loss
    smoothed = seen["smoothed"]
    assert smoothed["shown"] == "0.90" and smoothed["y"] != smoothed["raw"]
    assert smoothed["y"] == pytest.approx(ema(smoothed["raw"], 0.9), rel=1e-12)


def test_driver_sees_a_network_load(chromium, report, tmp_path):
    """The control: a page that asks the network for a script is caught by the same check."""
    seen, _ = drive(chromium, report, run="lr-3e-3", point=5, tmp_path=tmp_path,
                    extra_head='<img src="http://meshrun.invalid/pixel.png" alt="">')
    assert seen["resources"] == ["http://meshrun.invalid/pixel.png"]
