"""The live progress line keeps a usable bar, whole times, and loss and MFU whole at narrow
terminals (80 columns: only the end of the metrics, tokens/s, may be cut)."""
from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.progress import Progress

from launcher.views.progress import BAR_WIDTH, BAR_WIDTH_NARROW, describe, progress_columns

ROW = {"loss": 3.2123, "val_loss": 3.1999, "tokens_per_s": 123456.0, "mfu": 0.423}


def progress_line(columns: int, *, done: int = 4321, total: int = 10000) -> str:
    out = io.StringIO()
    console = Console(file=out, width=columns, force_terminal=True, color_system=None)
    with Progress(*progress_columns(terminal_columns=columns), console=console,
                  auto_refresh=False, get_time=lambda: 0.0) as progress:  # a frozen clock
        task = progress.add_task(describe(ROW), total=total)
        progress.update(task, completed=done)
        progress.refresh()
    frames = [f for f in out.getvalue().replace("\x1b[2K", "").split("\r") if f.strip()]
    return frames[-1].split("\n")[0]


@pytest.mark.parametrize(("columns", "bar"), [(60, BAR_WIDTH_NARROW), (80, BAR_WIDTH_NARROW),
                                              (120, BAR_WIDTH), (200, BAR_WIDTH)])
def test_bar_has_its_width_and_times_stay_whole(columns: int, bar: int):
    line = progress_line(columns)
    assert len(line) <= columns
    head, sep, rest = line.partition(" 0:00:00 -:--:-- ")
    assert sep, line  # elapsed and remaining are never cut
    assert head.startswith("step 4321/10000 ")
    assert len(head) - len("step 4321/10000 ") == bar, line
    assert rest.startswith("loss 3.2123")


def test_metrics_are_whole_on_a_wide_terminal_and_cut_with_an_ellipsis_on_a_narrow_one():
    assert progress_line(200).endswith("loss 3.2123  MFU 42.3%  val 3.1999  123,456 tok/s")
    assert progress_line(80).endswith("…")


@pytest.mark.parametrize(("done", "total"), [(4321, 10000), (99999, 100000), (1, 1000000)])
def test_mfu_stays_whole_at_80_columns(done: int, total: int):
    line = progress_line(80, done=done, total=total)
    assert len(line) <= 80 and line.startswith(f"step {done}/{total} ")
    assert "loss 3.2123  MFU 42.3%" in line, line
