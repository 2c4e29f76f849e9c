"""A tracker's web UI (TensorBoard, MLflow) served on this machine and opened in headless
Chromium, as the compare report's browser test (tests/sweeps/test_report_browser.py) opens the
report: `--dump-dom` hands back the page after its scripts ran.

Skipped when chromium is missing, except under CI, where it fails with the install command.
Set MESHRUN_SCREENSHOT_DIR to keep each page's screenshot for a person to look at.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

INSTALL = "apt-get install -y --no-install-recommends chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         # nothing but this machine resolves: a page that waits on the network fails, not hangs
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
         "--virtual-time-budget=20000", "--window-size=1400,1400")
START_TIMEOUT_S = 300.0
"""A UI server's start-up: `mlflow server` took 136 s on this 2-core machine at load 36."""


def chromium_or_skip() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail(f"chromium is missing; install it as root: {INSTALL}")
    pytest.skip(f"chromium is missing ({INSTALL})")


@contextlib.contextmanager
def served(python_args: list[str], ready_url: str, *, log: Path) -> Iterator[None]:
    """`python *python_args` (a UI server) running until the block ends; ready once
    `ready_url` answers 200. Its output goes to `log`, shown if it never gets ready."""
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, *python_args], stdout=out,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_ready(server, ready_url, log)
        yield
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _wait_ready(server: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the UI server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.5)
    pytest.fail(f"the UI server did not answer {url} within {START_TIMEOUT_S:.0f} s:\n"
                f"{log.read_text()[-3000:]}")


PAGE_TIMEOUT_S = 150.0
"""One headless load. MLflow's UI once kept Chromium's virtual clock from running out (every
request answered, the page idle, no dump after 300 s); a second launch is then tried."""


def open_page(chromium: str, url: str, *, profile: Path, screenshot_name: str) -> str:
    """The page's DOM after its scripts ran (and, with MESHRUN_SCREENSHOT_DIR, a screenshot)."""
    keep = os.environ.get("MESHRUN_SCREENSHOT_DIR")
    extra = [f"--screenshot={Path(keep) / screenshot_name}"] if keep else []
    for attempt in (1, 2):
        command = [chromium, *FLAGS, f"--user-data-dir={profile}-{attempt}", *extra,
                   "--dump-dom", url]
        try:
            result = subprocess.run(command, capture_output=True, text=True,
                                    timeout=PAGE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            continue
        assert result.returncode == 0, result.stderr[-2000:]
        return result.stdout
    pytest.fail(f"headless Chromium did not finish loading {url} in 2 x {PAGE_TIMEOUT_S:.0f} s")
