"""Sweep definitions: the sweep file format (YAML), inline sweeps, and loading both.

A sweep file (examples in conf/sweeps/)::

    name: debug_lr_warmup            # the W&B group and the sweep dir's name (default: file name)
    base:                            # overrides every point gets, as on the command line
      - model=debug
      - training.steps=60
    axes:                            # Hydra sweep grammar, one axis per entry:
      - optim.lr=1e-4,3e-4,1e-3      #   a,b,c  range(start,stop[,step])  choice(a,b)
      - schedule.warmup_steps=range(0,30,10)   # glob(llama*) over a config group's options
      - ["training.micro_batch_size=4,8", "training.grad_accum_steps=4,2"]  # a list: paired
                                     #   (zipped); quote them: YAML splits [a=1,2] at commas
    combine: grid                    # grid | zip | random | list
    samples: 8                       # random: how many points, drawn with `seed`; axes may also
    seed: 0                          #   be interval(lo,hi) or tag(log,interval(lo,hi))
    points:                          # list: the explicit points, each a list of overrides
      - [optim.lr=1e-3, schedule.warmup_steps=10]
    run_name: "lr{optim.lr}-wu{schedule.warmup_steps}"   # fields: varied keys, {sweep}, {index}
    parallel: 1                      # local: points run at once (when they fit this machine)
    array_parallelism: 8             # slurm: array tasks run at once

Command-line overrides given after a file are added: single values to `base`, sweeps as axes.
"""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from conf.compose import split_sweeps
from conf.errors import ConfigError, Problem, ProblemList
from conf.search_path import CONF_DIR

SWEEPS_DIR = CONF_DIR / "sweeps"
COMBINES = ("grid", "zip", "random", "list")
DEFAULT_ARRAY_PARALLELISM = 8
FILE_TITLE = "Invalid sweep file"
SWEEP_TITLE = "Invalid sweep"


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepDef:
    """What to sweep: everything a sweep file (or the command line) says."""

    name: str
    base: tuple[str, ...] = ()
    axes: tuple[tuple[str, ...], ...] = ()
    """Each entry is one axis, or several paired (zipped) axes."""
    combine: str = "grid"
    samples: int = 0
    seed: int = 0
    points: tuple[tuple[str, ...], ...] = ()
    run_name: str = ""
    """Template of each point's run name; empty = the sweep name and the varied values."""
    parallel: int = 1
    array_parallelism: int = DEFAULT_ARRAY_PARALLELISM
    source: str = ""
    """The sweep file it came from, or "" for an inline sweep."""

    def to_dict(self) -> dict:
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> SweepDef:
        return _build(data, source=str(data.get("source", "")), problems=None)


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def find_sweep_file(name_or_path: str) -> Path:
    """A path to a sweep file, or the name of one shipped in conf/sweeps/."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    shipped = SWEEPS_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    names = ", ".join(shipped_sweeps()) or "(none)"
    raise ConfigError([Problem("file", name_or_path, "is neither a file nor a shipped sweep",
                                f"give a path, or one of: {names}")], FILE_TITLE)


def shipped_sweeps() -> list[str]:
    return sorted(p.stem for p in SWEEPS_DIR.glob("*.yaml"))


def load_sweep_file(path: Path) -> SweepDef:
    """Read and check a sweep file; every problem is reported at once."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError([Problem("file", str(path), f"cannot be read ({first})",
                                    "fix the YAML")], FILE_TITLE) from None
    if not isinstance(data, dict):
        raise ConfigError([Problem("file", str(path), "must be a mapping (name:, base:, axes:, "
                                   "...)", "see conf/sweeps/ for examples")], FILE_TITLE)
    data = {"name": Path(path).stem, **data}
    problems = ProblemList()
    sweep = _build(data, source=str(path), problems=problems)
    problems.raise_if_any(f"{FILE_TITLE} {path}")
    return sweep


def _build(data: dict, *, source: str, problems: ProblemList | None) -> SweepDef:
    own = problems is None
    problems = ProblemList() if problems is None else problems
    known = [f.name for f in dataclasses.fields(SweepDef)]
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            fix = f"did you mean {close[0]}?" if close else f"use one of: {', '.join(known)}"
            problems.add(str(key), "", "unknown sweep file key", fix)
    fields = {
        "name": _string(data, "name", problems, default="sweep"),
        "base": _strings(data.get("base") or [], "base", problems),
        "axes": tuple(_axis_entry(e, problems) for e in _listed(data, "axes", problems)),
        "combine": _string(data, "combine", problems, default="grid"),
        "samples": _integer(data, "samples", problems, default=0),
        "seed": _integer(data, "seed", problems, default=0),
        "points": tuple(_strings(p, "points", problems) for p in _listed(data, "points", problems)),
        "run_name": _string(data, "run_name", problems, default=""),
        "parallel": _integer(data, "parallel", problems, default=1),
        "array_parallelism": _integer(data, "array_parallelism", problems,
                                      default=DEFAULT_ARRAY_PARALLELISM),
        "source": source,
    }
    sweep = SweepDef(**fields)
    check_sweep(sweep, problems)
    if own:
        problems.raise_if_any(SWEEP_TITLE)
    return sweep


def check_sweep(sweep: SweepDef, problems: ProblemList) -> None:
    """Rules between the fields (the axes themselves are checked when they are expanded)."""
    if sweep.combine not in COMBINES:
        problems.add("combine", sweep.combine, "unknown way to combine axes",
                     f"use one of: {', '.join(COMBINES)}")
    if sweep.combine == "random" and sweep.samples < 1:
        problems.add("samples", sweep.samples, "combine: random needs the number of points",
                     "set samples: N (--samples N)")
    if sweep.combine != "random" and sweep.samples:
        problems.add("samples", sweep.samples, "only applies to combine: random",
                     "remove it, or use combine: random")
    if sweep.combine == "list" and not sweep.points:
        problems.add("points", "[]", "combine: list needs explicit points",
                     "add points: [[key=value, ...], ...]")
    if sweep.combine != "list" and sweep.points:
        problems.add("points", len(sweep.points), "explicit points need combine: list",
                     "set combine: list (axes then add to every point)")
    if not sweep.axes and not sweep.points:
        problems.add("axes", "[]", "a sweep needs at least one axis or point",
                     "add an axis such as optim.lr=1e-4,3e-4")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", sweep.name):
        problems.add("name", sweep.name, "must be letters, digits, '_', '.' or '-'",
                     "it names the sweep dir and the W&B group")
    for line in split_sweeps(list(sweep.base))[1]:
        problems.add("base", line, "takes one value per key", "move this sweep to axes:")
    for key in ("parallel", "array_parallelism"):
        if getattr(sweep, key) < 1:
            problems.add(key, getattr(sweep, key), "must be >= 1", "give a positive count")


def inline_sweep(overrides: list[str], **settings) -> SweepDef:
    """`meshrun sweep key=a,b other=x`: sweep overrides become axes, the rest the base."""
    base, axes = split_sweeps(overrides)
    name = settings.pop("name", "") or default_name(base, axes)
    return _build({"name": name, "base": base, "axes": [[a] for a in axes], **settings},
                  source="", problems=None)


def extend(sweep: SweepDef, overrides: list[str], **settings) -> SweepDef:
    """A sweep file plus command-line overrides and flags. A single value for a swept key pins
    that axis (`cluster.nodes=1`); other single values join the base; sweeps add axes."""
    base, axes = split_sweeps(overrides)
    pinned = {_key(line) for line in base}
    kept = [[a for a in group if _key(a) not in pinned] for group in sweep.axes]
    data = {**sweep.to_dict(), **{k: v for k, v in settings.items() if v is not None}}
    data["base"] = list(sweep.base) + base
    data["axes"] = [g for g in kept if g] + [[a] for a in axes]
    return _build(data, source=sweep.source, problems=None)


def _key(line: str) -> str:
    return line.split("=", 1)[0].strip().lstrip("+~")


def default_name(base: list[str], axes: list[str]) -> str:
    """An inline sweep's name: the varied keys' last parts and a hash of the whole definition."""
    keys = [a.split("=", 1)[0].lstrip("+~").split(".")[-1] for a in axes]
    digest = hashlib.sha1("\n".join(base + ["--"] + axes).encode()).hexdigest()[:6]
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(keys)) or "sweep"
    return f"{stem}-{digest}"


def _string(data: dict, key: str, problems: ProblemList, *, default: str) -> str:
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, str):
        problems.add(key, value, "must be a string", f"write {key}: \"...\"")
        return default
    return value


def _integer(data: dict, key: str, problems: ProblemList, *, default: int) -> int:
    value = data.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        problems.add(key, value, "must be an integer", f"write {key}: N")
        return default
    return value


def _strings(value, key: str, problems: ProblemList) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        problems.add(key, value, "must be a list of overrides", f"write {key}: [key=value, ...]")
        return ()
    good = []
    for item in value:
        if isinstance(item, str):
            good.append(item)
        else:
            problems.add(key, item, "each entry must be one override string such as key=value",
                         "quote each override, e.g. - \"optim.lr=1e-3,3e-3\" (YAML reads "
                         "key: value as a mapping, and splits [a=1,2] at its commas)")
    return tuple(good)


def _listed(data: dict, key: str, problems: ProblemList) -> list:
    value = data.get(key) or []
    if not isinstance(value, list):
        problems.add(key, value, "must be a list", f"write {key}: followed by '- ...' lines")
        return []
    return value


def _axis_entry(entry, problems: ProblemList) -> tuple[str, ...]:
    return _strings(entry, "axes", problems)
