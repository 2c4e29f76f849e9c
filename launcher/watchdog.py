"""The local launcher's side of the hang watchdog (conf/run_dir/hang_watch.py): its exit
status, its report on stderr, and clearing an earlier leg's heartbeats."""
from __future__ import annotations

import sys
from pathlib import Path

from conf.run_dir.hang_watch import HangWatchdog
from conf.run_dir.heartbeats import HANG_REPORT_FILE, heartbeat_dir
from conf.run_dir.paths import RunDir

HUNG_EXIT = 3
"""The launcher's exit status for a run the watchdog stopped as hung."""


def clear_heartbeats(run_dir: Path) -> None:
    """Forget the heartbeats of an earlier leg (a resume): this launch's ranks write anew."""
    for path in heartbeat_dir(run_dir).glob("rank*.json"):
        path.unlink(missing_ok=True)


def hung_exit(watchdog: HangWatchdog) -> int:
    """Print the watchdog's report (stderr) and give the launcher's exit status for a hang."""
    sys.stderr.write(f"\n{watchdog.report}\nfull report with every rank's stack: "
                     f"{RunDir(watchdog.run_dir).logs_dir / HANG_REPORT_FILE}\n")
    return HUNG_EXIT
