"""Watching a local sweep: a live table on a terminal, plain lines anywhere else.

On a terminal (and with logging.progress on) `SweepWatch` shows one rich Live table: each point
with its state, step/steps, latest loss and run time, and a footer with how many points are
done and the sweep's ETA. The ETA assumes the steps still to run take as long as the steps run
so far (all points' steps, over the sweep's elapsed time), so it covers points running side by
side. Elsewhere (a pipe, a file, a test) it prints the same plain lines as before: one when a
point starts (`[k/n] point ...`), one when it ends.

Step and loss come from each running point's metrics.jsonl
(launcher.views.progress.MetricsTail), read when the table is redrawn (twice a second).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table

from launcher.views.progress import MetricsTail
from sweeps.track import STYLES

PENDING, RUNNING, COMPLETED, FAILED, STOPPED = "pending", "running", "completed", "failed", "stopped"
ENDED = (COMPLETED, FAILED, STOPPED)
INTERRUPTED = 130
MAX_ROWS = 24
"""Bigger sweeps show the running and failed points first, then as many others as fit."""
REFRESH_PER_S = 2


@dataclass(kw_only=True)
class PointProgress:
    """Where one point of a local sweep stands, as the watch table shows it."""

    index: int
    name: str
    steps: int
    state: str = PENDING
    step: int = 0
    loss: float | None = None
    run_dir: Path | None = None
    started_s: float | None = None
    ended_s: float | None = None
    tail: MetricsTail | None = None

    def poll(self) -> None:
        """Take the latest train row of a running point's metrics.jsonl."""
        if self.tail is None or self.state != RUNNING:
            return
        for row in self.tail.new_rows():
            if row.get("kind") == "train":
                self.step, self.loss = row["step"], row.get("loss", self.loss)

    @property
    def steps_done(self) -> int:
        """Steps that count as done for the ETA: all of them once the point has ended."""
        return self.steps if self.state in ENDED else min(self.step, self.steps)


def sweep_eta_s(points: list[PointProgress], *, elapsed_s: float) -> float | None:
    """Seconds left for the whole sweep at the pace so far; None before the first step."""
    done = sum(p.steps_done for p in points)
    total = sum(p.steps for p in points)
    if done <= 0 or elapsed_s <= 0:
        return None
    return elapsed_s * (total - done) / done


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def watch_table(points: list[PointProgress], *, elapsed_s: float, now_s: float,
                title: str = "") -> Table:
    """The live sweep table: one row per point, a footer with counts, elapsed time and ETA."""
    table = Table(title=title or None, title_justify="left", caption_justify="left")
    for column in ("#", "point", "state", "step", "loss", "time"):
        table.add_column(column, justify="right" if column in ("#", "step", "loss", "time")
                         else "left", no_wrap=column != "point")
    shown = _rows_to_show(points)
    for p in shown:
        ran_s = None if p.started_s is None else (p.ended_s or now_s) - p.started_s
        table.add_row(str(p.index), p.name, f"[{STYLES.get(p.state, 'red')}]{p.state}[/]",
                      f"{p.step}/{p.steps}" if p.state != PENDING else f"-/{p.steps}",
                      f"{p.loss:.4f}" if p.loss is not None else "-", format_duration(ran_s))
    if len(shown) < len(points):
        table.add_row("", f"... {len(points) - len(shown)} more", "", "", "", "")
    table.caption = sweep_footer(points, elapsed_s=elapsed_s)
    return table


def sweep_footer(points: list[PointProgress], *, elapsed_s: float) -> str:
    ended = sum(p.state in ENDED for p in points)
    running = sum(p.state == RUNNING for p in points)
    failed = sum(p.state == FAILED for p in points)
    parts = [f"{ended}/{len(points)} done", f"{running} running"]
    if failed:
        parts.append(f"{failed} failed")
    eta = sweep_eta_s(points, elapsed_s=elapsed_s)
    parts += [f"elapsed {format_duration(elapsed_s)}",
              "ETA " + (format_duration(eta) if ended < len(points) else "0:00")]
    return ", ".join(parts)


def _rows_to_show(points: list[PointProgress]) -> list[PointProgress]:
    if len(points) <= MAX_ROWS:
        return points
    first = [p for p in points if p.state in (RUNNING, FAILED)][:MAX_ROWS]
    others = [p for p in points if p not in first][:MAX_ROWS - len(first)]
    return sorted(first + others, key=lambda p: p.index)


class SweepWatch:
    """What a local sweep shows while it runs: `started`/`ended` per point, either as lines or
    as the live table. Use as a context manager (the live table needs stopping)."""

    def __init__(self, console: Console, points: list[PointProgress], *, live: bool,
                 title: str = "") -> None:
        self.console = console
        self.points = {p.index: p for p in points}
        self.live = live
        self.title = title
        self.started_s = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> SweepWatch:
        if self.live:
            # stdout prints (the console's own lines) go above the table; stderr is left alone
            # so a point launched in this process can send its own progress to its log.
            self._live = Live(get_renderable=self.render, console=self.console,
                              refresh_per_second=REFRESH_PER_S, redirect_stderr=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    def render(self) -> Table:
        now = time.monotonic()
        for p in self.points.values():
            p.poll()
        return watch_table(list(self.points.values()), elapsed_s=now - self.started_s,
                           now_s=now, title=self.title)

    def started(self, *, index: int, run_dir: Path, n: int, total: int) -> None:
        p = self.points[index]
        p.state, p.run_dir, p.started_s = RUNNING, run_dir, time.monotonic()
        from conf.run_dir.paths import RunDir

        p.tail = MetricsTail(RunDir(run_dir).metrics_file)
        if not self.live:
            self.console.print(f"[{n}/{total}] point {index} {p.name}: {run_dir}",
                               markup=False, soft_wrap=True)

    def ended(self, *, index: int, status: int) -> None:
        p = self.points[index]
        p.poll()
        p.ended_s = time.monotonic()
        p.state = (COMPLETED if status == 0 else STOPPED if status == INTERRUPTED else FAILED)
