"""The compare report in a real headless browser (Debian's chromium): it renders, every run is in
the DOM, the inline script ran without errors and sorted the table, and a screenshot is taken.

Skipped when chromium is missing, except under CI, where it fails with the install command.
Set MESHRUN_SCREENSHOT_DIR to keep the screenshot (report.png) for a person to look at.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from sweeps.compare import collect_runs, differing_keys
from sweeps.report import write_report
from tests.sweeps.test_compare import POINTS, write_sweep

INSTALL = "apt-get install -y --no-install-recommends chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0")
SCRIPT_ERROR = re.compile(r"Uncaught|ERROR:CONSOLE")  # chromium logs page errors so


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail(f"chromium is missing; install it as root: {INSTALL}")
    pytest.skip(f"chromium is missing ({INSTALL})")


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
