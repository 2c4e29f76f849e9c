"""The report's plot colours: every run its own colour, and no two that look alike."""
from __future__ import annotations

import itertools
from pathlib import Path

from sweeps.compare import RunRecord
from sweeps.report_plots import NO_DATA_COLOR, run_colors

MIN_DELTA_E = 25.0
"""CIE76 distance below which two line colours are easily confused; tab20's light/dark pairs of
one hue (the report's old palette for >10 runs) come as close as 16.6."""


def lab(color: str) -> tuple[float, float, float]:
    """sRGB hex -> CIELAB (D65), the textbook formulas."""
    rgb = [int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    xyz = [sum(m * c for m, c in zip(row, lin)) for row in
           ((0.4124, 0.3576, 0.1805), (0.2126, 0.7152, 0.0722), (0.0193, 0.1192, 0.9505))]
    f = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116
         for t in (v / w for v, w in zip(xyz, (0.95047, 1.0, 1.08883)))]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def records(count: int, *, without_config: int = 0) -> list[RunRecord]:
    return [RunRecord(name=f"run-{i}", run_dir=Path(f"/r/{i}"), state="completed",
                      config={} if i < without_config else {"optim.lr": i})
            for i in range(count)]


def closest_pair(colors: list[str]) -> float:
    return min(sum((a - b) ** 2 for a, b in zip(lab(c), lab(d))) ** 0.5
               for c, d in itertools.combinations(colors, 2))


def test_twelve_runs_get_twelve_clearly_different_colours():
    for count in (3, 10, 11, 12, 16, 20):
        colors = list(run_colors(records(count)).values())
        assert len(set(colors)) == count
        assert closest_pair(colors) >= MIN_DELTA_E, count
    assert len(set(run_colors(records(24)).values())) == 24


def test_the_old_paired_palette_fails_the_same_check():
    """The control: tab20 (pairs of one hue) is what the check is there to refuse."""
    tab20_first12 = ["#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a",
                     "#d62728", "#ff9896", "#9467bd", "#c5b0d5", "#8c564b", "#c49c94"]
    assert closest_pair(tab20_first12) < MIN_DELTA_E


def test_runs_without_data_are_grey_and_take_no_colour():
    colors = run_colors(records(4, without_config=1))
    assert colors["run-0"] == NO_DATA_COLOR
    assert len({colors[f"run-{i}"] for i in (1, 2, 3)} | {NO_DATA_COLOR}) == 4
