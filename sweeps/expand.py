"""Expand a sweep definition into points: base overrides + one value per axis.

Axes use Hydra's sweep grammar, parsed by `conf.compose.parse_override`: `a,b,c`, `choice(...)`,
`range(...)`, `glob(...)` over a config group's options, and (random only) `interval(lo,hi)` or
`tag(log,interval(lo,hi))`. Expansion is deterministic: the same definition and seed give the
same points in the same order (grid order: the first axis varies slowest, as in Hydra).
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

from conf.compose import ParsedOverride, display_value, quote_value, try_parse_override
from conf.errors import ProblemList
from conf.overrides import GROUPS, OPTIONAL_GROUPS, group_options
from sweeps.naming import (NAME_KEY, base_values, check_template, check_unique_names,
                           check_user_name, point_template, render_name, wandb_group_and_tags)
from sweeps.spec_file import SWEEP_TITLE, SweepDef

MAX_POINTS = 10_000
"""Most points a sweep may have unless `--max-points N` lifts it (each point is a run); counted
from the axes' sizes, before any point (or a range's values) is materialised."""
MAX_POINTS_FIX = "pass --max-points N to allow more (each point is a run)"
Choice = tuple[tuple[str, str, str], ...]
"""One value of a group: (override line, varied key, value as shown) per paired axis."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    index: int
    overrides: tuple[str, ...]
    """What the user asked for: the base overrides, then this point's axis values."""
    values: dict[str, str]
    """Varied key -> its value at this point, as shown in tables, names and tags."""
    name: str
    """The run name, from the sweep's run_name template."""
    group: str
    """W&B group: the sweep name, or "" when the base overrides set logging.wandb_group."""
    tags: tuple[str, ...]
    """W&B tags: any the base overrides give, then `key=value` per varied key."""

    @property
    def settings(self) -> dict[str, object]:
        """What the sweep sets on top of `overrides`, by key (as `run_overrides` writes it)."""
        out: dict[str, object] = {"name": self.name}
        if self.group:
            out["logging.wandb_group"] = self.group
        out["logging.wandb_tags"] = list(self.tags)
        return out

    @property
    def run_overrides(self) -> tuple[str, ...]:
        """The overrides of the point's run (its overrides.json, minus runs_dir)."""
        extra = [f"name={quote_value(self.name)}"]
        if self.group:
            extra.append(f"logging.wandb_group={quote_value(self.group)}")
        extra.append("logging.wandb_tags=[" + ",".join(quote_value(t) for t in self.tags) + "]")
        return self.overrides + tuple(extra)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Group:
    choices: list[Choice]
    interval: tuple[str, str, float, float, bool] | None = None
    """(axis key as written, varied key, low, high, log): random sweeps only."""


def expand(sweep: SweepDef, *, max_points: int = MAX_POINTS) -> list[Point]:
    """Every point of the sweep; one ConfigError lists every problem with the axes. More than
    `max_points` points are refused before they are made."""
    problems = ProblemList()
    groups = [g for g in (_parse_group(entry, sweep, problems, max_points)
                          for entry in sweep.axes) if g is not None]
    if sweep.points:
        groups.insert(0, _list_group(sweep.points, problems))
    _check_keys(groups, problems)
    problems.raise_if_any(SWEEP_TITLE)
    combos = _combine(groups, sweep, problems, max_points)
    problems.raise_if_any(SWEEP_TITLE)
    keys = list(dict.fromkeys(key for combo in combos for _, key, _ in combo))
    fixed = base_values(sweep.base)
    check_template(sweep.run_name or point_template("", keys, fixed), keys, fixed, problems)
    check_user_name(sweep.run_name, keys, fixed, problems)
    problems.raise_if_any(SWEEP_TITLE)
    points = []
    for index, combo in enumerate(combos):
        overrides = tuple(sweep.base) + tuple(line for line, _, _ in combo)
        values = {key: shown for _, key, shown in combo}
        template = point_template(sweep.run_name, list(values), fixed)
        name = render_name(template, values, fixed, sweep=sweep.name, index=index)
        group, tags = wandb_group_and_tags(overrides, group=sweep.name, values=values)
        points.append(Point(index=index, overrides=overrides, values=values, name=name,
                            group=group, tags=tags))
    if NAME_KEY in fixed or NAME_KEY in keys:
        check_unique_names([p.name for p in points], problems)
        problems.raise_if_any(SWEEP_TITLE)
    return points


def _parse_group(entry: tuple[str, ...], sweep: SweepDef, problems: ProblemList,
                 max_points: int) -> _Group | None:
    """One axis, or several paired axes (all the same length), as a list of choices."""
    columns, interval = [], None
    for line in entry:
        ov, syntax_error = try_parse_override(line)
        if ov is None:
            problems.add(line, "", f"is not valid sweep syntax ({syntax_error})",
                         "write key=a,b,c or key=range(0,10,2) or key=choice(a,b)")
            continue
        key, name = line.split("=", 1)[0].strip(), ov.key
        if ov.sweep is not None and ov.sweep.kind == "interval":
            if sweep.combine != "random" or len(entry) > 1:
                problems.add(line, "", "interval() needs combine: random and cannot be paired",
                             "use combine: random, or list values (a,b,c) / range()")
                continue
            low, high, log = ov.sweep.low, ov.sweep.high, ov.sweep.log
            if log and low <= 0:
                problems.add(line, "", "a log interval needs a positive lower bound",
                             "e.g. tag(log,interval(1e-5,1e-2))")
            interval = (key, name, low, high, log)
            continue
        if ov.sweep is not None and ov.sweep.count > max_points:  # counted, not listed
            problems.add(line, "", f"has {ov.sweep.count:,} values, more than {max_points:,} "
                         "points", MAX_POINTS_FIX)
            continue
        values = _axis_values(ov, name, sweep, problems, line)
        columns.append([(f"{key}={v}", name, display_value(name, v)) for v in values])
    if interval:
        return _Group(choices=[], interval=interval)
    if not columns:
        return None
    lengths = {len(c) for c in columns}
    if len(lengths) > 1:
        problems.add(" | ".join(entry), "", f"paired axes must have equal lengths (have "
                     f"{', '.join(str(len(c)) for c in columns)})", "give each the same count")
        return None
    return _Group(choices=[tuple(c) for c in zip(*columns)])


def _axis_values(ov: ParsedOverride, name: str, sweep: SweepDef, problems: ProblemList,
                 line: str) -> list[str]:
    if ov.sweep is None:
        return [ov.value_str]
    if ov.sweep.kind == "glob":
        if name not in GROUPS + OPTIONAL_GROUPS:
            problems.add(line, "", "glob() selects options of a config group",
                         f"use it with one of: {', '.join(GROUPS + OPTIONAL_GROUPS)}")
            return []
        chosen = ov.sweep.select(group_options(name))
        if not chosen:
            problems.add(line, "", f"matches no {name} option",
                         f"options: {', '.join(group_options(name))}")
        return chosen
    values = list(ov.sweep.values)
    if ov.sweep.shuffle:  # Hydra would shuffle with the global RNG: shuffle with the sweep's seed
        random.Random(sweep.seed).shuffle(values)
    if not values:
        problems.add(line, "", "has no values", "give at least one value")
    return values


def _list_group(points: tuple[tuple[str, ...], ...], problems: ProblemList) -> _Group:
    choices = []
    for point in points:
        choice = []
        for line in point:
            ov, syntax_error = try_parse_override(line)
            if ov is None:
                problems.add(line, "", f"is not valid override syntax ({syntax_error})",
                             "write key=value")
                continue
            if ov.is_sweep:
                problems.add(line, "", "an explicit point takes one value per key",
                             "put sweeps in axes:, or list each point")
                continue
            choice.append((line, ov.key, display_value(ov.key, ov.value_str)))
        choices.append(tuple(choice))
    return _Group(choices=choices)


def _check_keys(groups: list[_Group], problems: ProblemList) -> None:
    seen: dict[str, int] = {}
    for i, group in enumerate(groups):
        keys = {key for choice in group.choices for _, key, _ in choice}
        if group.interval:
            keys.add(group.interval[1])
        for key in keys:
            if key in seen and seen[key] != i:
                problems.add(key, "", "is swept by two axes", "merge them into one axis")
            seen[key] = i


def _combine(groups: list[_Group], sweep: SweepDef, problems: ProblemList,
             max_points: int) -> list[Choice]:
    if sweep.combine == "random":
        if sweep.samples > max_points:
            problems.add("samples", f"{sweep.samples:,}", f"is more than {max_points:,} points",
                         f"use fewer samples, or {MAX_POINTS_FIX}")
            return []
        return _sample(groups, sweep, problems)
    sizes = [len(g.choices) for g in groups]
    if sweep.combine == "zip":
        if len(set(sizes)) > 1:
            problems.add("combine", "zip", f"zipped axes must have equal lengths (have "
                         f"{', '.join(map(str, sizes))})", "give each axis the same count")
            return []
        return [sum(c, ()) for c in zip(*(g.choices for g in groups))]
    total = math.prod(sizes)
    if total > max_points:
        problems.add("axes", f"{' x '.join(map(str, sizes))} = {total:,} points",
                     f"is more than {max_points:,} points",
                     f"use combine: random with samples, or {MAX_POINTS_FIX}")
        return []
    return [sum(c, ()) for c in itertools.product(*(g.choices for g in groups))]


def _sample(groups: list[_Group], sweep: SweepDef, problems: ProblemList) -> list[Choice]:
    rng = random.Random(sweep.seed)
    if any(g.interval for g in groups):
        return [sum((_draw(g, rng) for g in groups), ()) for _ in range(sweep.samples)]
    sizes = [len(g.choices) for g in groups]
    total = math.prod(sizes)
    if sweep.samples > total:
        problems.add("samples", sweep.samples, f"is more than the {total} distinct points "
                     "of the axes", f"use samples <= {total}, or combine: grid")
        return []
    picked = sorted(rng.sample(range(total), sweep.samples))
    out = []
    for flat in picked:
        combo: Choice = ()
        for group, size, stride in zip(groups, sizes, _strides(sizes)):
            combo += group.choices[(flat // stride) % size]
        out.append(combo)
    return out


def _strides(sizes: list[int]) -> list[int]:
    return [math.prod(sizes[i + 1:]) for i in range(len(sizes))]


def _draw(group: _Group, rng: random.Random) -> Choice:
    if group.interval is None:
        return group.choices[rng.randrange(len(group.choices))]
    key, name, low, high, log = group.interval
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if log else rng.uniform(low, high)
    text = f"{value:.6g}"
    return ((f"{key}={text}", name, text),)
