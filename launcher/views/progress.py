"""Follow a running job through its metrics.jsonl: a live progress line, then a summary."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Column
from rich.text import Text
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from conf.run_dir.failure_diagnosis import failure_tail
from conf.run_dir.metrics_rows import NOTE_ROW_KIND, parse_metrics_line
from conf.run_dir.paths import RunDir
from conf.spec import RunSpec
from launcher.backends.process_lifetime import kill_tree, output_gone

POLL_S = 0.5
PLAIN_LINES = 10  # progress lines printed when the output is not a terminal


class MetricsTail:
    """Reads the rows appended to metrics.jsonl since the last call. Survives any content:
    lines that are not JSON objects are skipped, and a file that shrank is read again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = ""

    def new_rows(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, errors="replace") as f:
            if os.fstat(f.fileno()).st_size < self.offset:  # replaced or truncated
                self.offset, self.partial = 0, ""
            f.seek(self.offset)
            text = self.partial + f.read()
            self.offset = f.tell()
        *lines, self.partial = text.split("\n")
        return [row for row in map(parse_metrics_line, lines) if row is not None]


def describe(row: dict) -> str:
    """loss, MFU, val loss, tokens/s: most wanted first, since a narrow terminal cuts the end
    (at 80 columns the progress line keeps loss and MFU whole)."""
    mfu = f"{100 * row['mfu']:.1f}%" if row.get("mfu") is not None else "-"
    parts = [f"loss {row['loss']:.4f}", f"MFU {mfu}"]
    if "val_loss" in row:
        parts.append(f"val {row['val_loss']:.4f}")
    parts.append(f"{row['tokens_per_s']:,.0f} tok/s")
    return "  ".join(parts)


def watch_run(proc, *, run_dir: Path, spec: RunSpec, show_progress: bool) -> int:
    """Wait for `proc` (a Popen, or anything with poll() and returncode), showing progress.

    Ctrl-C stops a local job (its ranks checkpoint first; a second Ctrl-C kills them now);
    so does the reader of our output going away (`meshrun run | head -1`). A Slurm job keeps
    running.
    """
    console = _Console(stderr=True)
    tail = MetricsTail(RunDir(run_dir).metrics_file)
    live = show_progress and console.is_terminal
    local = isinstance(proc, subprocess.Popen)
    try:
        if live:
            _follow_live(proc, tail, spec, console, local=local)
        else:
            _follow_plain(proc, tail, spec, console, local=local)
    except (KeyboardInterrupt, BrokenPipeError) as stop:
        if not local:
            _say(console, f"[yellow]detached; the job runs on: meshrun status {run_dir}")
            return 130
        _stop_ranks(proc, console, why="output closed" if isinstance(stop, BrokenPipeError)
                    else "stopping")
        _say(console, f"[yellow]stopped; resume with: meshrun resume {run_dir}")
        return 130
    return proc.returncode


NARROW_COLUMNS = 100
"""Below this terminal width the bar is BAR_WIDTH_NARROW characters, else BAR_WIDTH."""
BAR_WIDTH, BAR_WIDTH_NARROW = 20, 10


def progress_columns(*, terminal_columns: int) -> tuple:
    """step, a fixed-width bar, times, then the metrics. rich's default bar (40) collapsed to
    5 characters at 80 columns; now the metrics text is what gets cut (with an ellipsis), from
    its end: `describe` puts loss and MFU first."""
    bar = BAR_WIDTH_NARROW if terminal_columns < NARROW_COLUMNS else BAR_WIDTH
    fixed = dict(no_wrap=True)
    return (TextColumn("step {task.completed}/{task.total}", table_column=Column(**fixed)),
            BarColumn(bar_width=bar, table_column=Column(min_width=bar, **fixed)),
            TimeElapsedColumn(table_column=Column(**fixed)),
            TimeRemainingColumn(table_column=Column(**fixed)),
            MetricsColumn("{task.description}", table_column=Column(no_wrap=False)))


class MetricsColumn(TextColumn):
    """The metrics text on one line, cut with an ellipsis when the terminal is narrow (its
    column is the only one rich may shrink)."""

    def render(self, task) -> Text:
        text = super().render(task)
        text.no_wrap, text.overflow = True, "ellipsis"
        return text


class _Console(Console):
    """A console whose broken pipe raises BrokenPipeError (rich's default exits the process,
    which would leave the ranks to their parent-death signal)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.file.fileno())
        os.close(devnull)
        raise BrokenPipeError


def _stop_ranks(proc: subprocess.Popen, console: Console, *, why: str) -> None:
    """SIGTERM torchrun (it forwards it; the ranks checkpoint and stop) and wait; a second
    SIGINT/SIGTERM/SIGHUP meanwhile SIGKILLs torchrun and every rank at once."""
    def kill_now(signum: int, frame) -> None:
        if proc.returncode is None:  # never after the wait: its pid may be another's by then
            _say(console, "[red]second signal: killing the ranks now (no checkpoint)")
            kill_tree(proc.pid)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, kill_now)
    _say(console, f"[yellow]{why}: the ranks finish their step and save a checkpoint "
                  "(Ctrl-C again to kill them now)...")
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    proc.wait()


def _say(console: Console, text: str) -> None:
    try:
        console.print(text)
    except BrokenPipeError:
        pass


def _wait(proc, seconds: float) -> None:
    """Up to `seconds`, returning as soon as a local torchrun exits (the run's last rows
    are then read at once, not at the next poll); a Slurm job is polled after `seconds`."""
    if isinstance(proc, subprocess.Popen):
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass
    else:
        time.sleep(seconds)


def _check_output(local: bool) -> None:
    if local and output_gone():
        raise BrokenPipeError


def _follow_live(proc, tail: MetricsTail, spec: RunSpec, console: Console, *,
                 local: bool) -> None:
    last_val = {}
    columns = progress_columns(terminal_columns=console.width)
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("starting ranks...", total=spec.training.steps)
        while proc.poll() is None:
            _wait(proc, POLL_S)
            _check_output(local)
            for row in tail.new_rows():
                if row.get("kind") == "eval":
                    last_val = {"val_loss": row["val_loss"]}
                elif row.get("kind") == NOTE_ROW_KIND:
                    progress.console.print(str(row.get("message")), markup=False,
                                           highlight=False, soft_wrap=True)
                elif row.get("kind") == "train":
                    progress.update(task, completed=row["step"], description=describe({**row, **last_val}))


def _follow_plain(proc, tail: MetricsTail, spec: RunSpec, console: Console, *,
                  local: bool) -> None:
    every = max(1, spec.training.steps // PLAIN_LINES)
    last_val = {}
    while True:
        done = proc.poll() is not None
        for row in tail.new_rows():
            if row.get("kind") == "eval":
                last_val = {"val_loss": row["val_loss"]}
                console.print(f"eval  step {row['step']}: val loss {row['val_loss']:.4f}")
            elif row.get("kind") == NOTE_ROW_KIND:
                console.print(str(row.get("message")), markup=False, highlight=False,
                              soft_wrap=True)
            elif row.get("kind") == "train" and (row["step"] % every == 0 or row["step"] == 1):
                console.print(f"train step {row['step']}/{spec.training.steps}: "
                              f"{describe({**row, **last_val})}")
        if done:
            return
        _check_output(local)
        _wait(proc, POLL_S)


def print_failure(run_dir: Path, status: int) -> None:
    sys.stderr.write(f"\nrun failed (exit status {status}); {failure_tail(run_dir)}\n")
