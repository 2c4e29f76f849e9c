"""Sweep tables that fit an 80-column terminal without cutting what a user reads or copies.

The house way (the sweep preview first): no rules between columns, headers broken after '.'
or '_' to be no wider than their cells (`wrapped_header`), the cells that must stay whole
(index, state, loss, MFU) never wrapped, and what may be long (a run name, a run dir) folded
onto more lines instead of cut with an ellipsis. A table with more columns than fit is shown
as several tables, each led by the row number (`pack_columns`): wrapped, not cut.
"""
from __future__ import annotations

import os

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

COLUMN_GAP = 2
"""Characters between two columns of a box-less table (rich's padding (0, 1) on each side)."""


def wrapped_header(name: str, width: int) -> str:
    """A header no wider than its cells where it can break: after '.' or '_'."""
    lines: list[str] = []
    for piece in name.replace(".", ".\n").replace("_", "_\n").split("\n"):
        if lines and len(lines[-1]) + len(piece) <= max(width, 5):
            lines[-1] += piece
        else:
            lines.append(piece)
    return "\n".join(lines)


def column_width(header: str, cells: list[str]) -> int:
    """The width a column needs: its widest cell, or its header's widest unbreakable piece."""
    widest = max((len(c) for c in cells), default=1)
    return max(widest, *(len(line) for line in wrapped_header(header, widest).splitlines()))


def pack_columns(widths: dict[str, int], *, width: int, lead: str) -> list[list[str]]:
    """Split the columns (in order) into groups that each fit `width` after the `lead`
    column, which every group repeats; a column wider than a group alone gets its own."""
    groups: list[list[str]] = []
    used = width + 1
    for name, need in widths.items():
        if name == lead:
            continue
        if used + COLUMN_GAP + need > width:
            groups.append([lead])
            used = widths[lead]
        groups[-1].append(name)
        used += COLUMN_GAP + need
    return groups


def fits_the_terminal(console: Console) -> bool:
    """Fit the console's width in a terminal, or when COLUMNS is set (as a user or a test
    does to ask for a width); in a pipe or file without it, print whole rows."""
    return console.is_terminal or bool(os.environ.get("COLUMNS"))


def whole_width(console: Console, table: Table) -> int:
    """The width `table` takes with nothing folded."""
    return Measurement.get(console, console.options.update(max_width=10_000), table).maximum


def print_fitted(table: Table, console: Console) -> None:
    """At the terminal's width (folding what may fold), or whole rows in a pipe or file."""
    whole = whole_width(console, table)
    if whole <= console.width or fits_the_terminal(console):
        console.print(table)
    else:
        Console(file=console.file, width=whole, no_color=console.no_color,
                force_terminal=False).print(table)
