"""Hydra's override grammar, returned as plain Python data.

`key=value`, `+key=value`, `++key=value`, `~key`, `group@package=option`, and the sweep forms
`a,b,c`, `choice(...)`, `range(start,stop[,step])`, `shuffle(...)`, `sort(...)`,
`glob(include,exclude=...)`, `interval(lo,hi)` and `tag(log,interval(lo,hi))` are parsed by
Hydra's own OverridesParser, so they mean exactly what they mean to Hydra. Callers get
`ParsedOverride` / `SweepValues` (strings, numbers, lists, dicts), never a Hydra object.

Each distinct line is parsed once per process (a parse costs ~1 ms; a sweep repeats its lines).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import fnmatch
import functools
import re
from dataclasses import dataclass

PARSE_CACHE_LINES = 1 << 16
RANGE_LISTED_MAX = 1_000_000
"""A range sweep with more values than this is counted, not listed (callers refuse it)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepValues:
    """The several values of a sweep override (`key=a,b`, `range(...)`, `glob(...)`, ...)."""

    kind: str
    """"choice" (a,b,c / choice / sort / shuffle), "range", "glob" or "interval"."""
    values: tuple[str, ...] = ()
    """choice and range: each value as override text, in Hydra's order before any shuffle
    (empty for a range of more than RANGE_LISTED_MAX values: see `count`)."""
    count: int = 0
    """choice and range: how many values; a huge range is counted, never listed."""
    shuffle: bool = False
    """choice and range: Hydra would shuffle the values (callers shuffle with their own seed)."""
    include: tuple[str, ...] = ()
    """glob: the fnmatch patterns an option must match."""
    exclude: tuple[str, ...] = ()
    """glob: the fnmatch patterns that drop an option."""
    low: float = 0.0
    """interval: the lower bound."""
    high: float = 0.0
    """interval: the upper bound."""
    log: bool = False
    """interval: tagged `log` (sample log-uniformly)."""

    def select(self, names: list[str]) -> list[str]:
        """glob: the names it selects, in the given order (Hydra's `Glob.filter`)."""
        def matches(name: str, patterns: tuple[str, ...]) -> bool:
            return any(fnmatch.fnmatch(name, p) for p in patterns)

        return [n for n in names if matches(n, self.include) and not matches(n, self.exclude)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedOverride:
    """One command-line override, as Hydra reads it. Shared between callers: do not mutate."""

    line: str
    """The override as written."""
    key: str
    """The key or config group, without `+`, `++`, `~` or `@package`."""
    action: str
    """"set" (key=v), "add" (+key=v), "force_add" (++key=v) or "delete" (~key[=v])."""
    package: str | None = None
    """The `@package` of a group override (`group@pkg=option`), else None."""
    value: object = None
    """A single value as Hydra reads it (quotes removed): str, int, float, bool, None, list or
    dict. None for a sweep and for `~key` without a value."""
    value_str: str = ""
    """A single value written back as override text (Hydra's canonical form, e.g. 1e-4 ->
    0.0001; "null" for `~key` without a value); "" for a sweep."""
    value_text: str = ""
    """The text after `=`, as given (also for sweeps); "" when there is none."""
    sweep: SweepValues | None = None
    """The values, when the override is a sweep."""

    @property
    def is_sweep(self) -> bool:
        return self.sweep is not None

    @property
    def is_add(self) -> bool:
        return self.action == "add"

    @property
    def is_force_add(self) -> bool:
        return self.action == "force_add"

    @property
    def is_delete(self) -> bool:
        return self.action == "delete"


class OverrideSyntaxError(ValueError):
    """An override Hydra's grammar refuses; the message is the first line of Hydra's error."""


def parse_override(line: str) -> ParsedOverride:
    """Parse one override; raise OverrideSyntaxError when it is not valid override syntax."""
    parsed = _parsed(line)
    if isinstance(parsed, str):
        raise OverrideSyntaxError(parsed)
    return parsed


def try_parse_override(line: str) -> tuple[ParsedOverride | None, str]:
    """(the parsed override, "") or (None, the first line of Hydra's syntax error)."""
    parsed = _parsed(line)
    return (None, parsed) if isinstance(parsed, str) else (parsed, "")


def split_sweeps(lines: list[str]) -> tuple[list[str], list[str]]:
    """(single-value overrides, sweep overrides), each in the given order. Lines that do not
    parse count as single values (whoever composes them reports the syntax error)."""
    single, sweeps = [], []
    for line in lines:
        parsed, _ = try_parse_override(line)
        (sweeps if parsed is not None and parsed.is_sweep else single).append(line)
    return single, sweeps


def display_value(key: str, value_text: str) -> str:
    """A single value as shown in tables, names and tags: quotes removed, numbers as Hydra reads
    them (1e-4 -> 0.0001), true/false/null; anything else (lists, sweeps, bad syntax) as written."""
    parsed, _ = try_parse_override(f"{key.lstrip('+~')}={value_text}")
    if parsed is None or parsed.is_sweep:
        return value_text
    value = parsed.value
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    return str(value) if isinstance(value, (str, int, float)) else value_text


def quote_value(text: str) -> str:
    """`text` as a single-quoted override value that Hydra parses back to exactly `text`."""
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"


@functools.lru_cache(maxsize=PARSE_CACHE_LINES)
def _parsed(line: str) -> ParsedOverride | str:
    """The plain override, or the first line of Hydra's syntax error."""
    from hydra.errors import OverrideParseException

    try:
        hydra_override = _hydra_override(line)
    except OverrideParseException as err:
        return str(err).strip().splitlines()[0]
    return _plain(hydra_override)


@functools.lru_cache(maxsize=PARSE_CACHE_LINES)
def _hydra_override(line: str):
    """Hydra's own Override object for one line: for the compose package only (it never
    leaves conf.compose). Raises hydra.errors.OverrideParseException."""
    (override,) = _parser().parse_overrides([line])
    return override


@functools.cache
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


_ACTIONS = {"CHANGE": "set", "ADD": "add", "FORCE_ADD": "force_add", "DEL": "delete"}


def _plain(ov) -> ParsedOverride:
    has_value = ov.value_type is not None
    sweep = _sweep_values(ov) if ov.is_sweep_override() else None
    return ParsedOverride(
        line=ov.input_line, key=ov.key_or_group, action=_ACTIONS[ov.type.name],
        package=ov.package, value=None if sweep else copy.deepcopy(ov.value()),
        value_str="" if sweep else ov.get_value_element_as_str(),
        value_text=ov.get_value_string() if has_value else "", sweep=sweep)


def _sweep_values(ov) -> SweepValues:
    value = ov.value()
    kind = type(value).__name__
    if kind == "Glob":
        return SweepValues(kind="glob", include=tuple(value.include),
                           exclude=tuple(value.exclude))
    if kind == "IntervalSweep":
        return SweepValues(kind="interval", low=value.start, high=value.end,
                           log="log" in value.tags)
    shuffle = bool(getattr(value, "shuffle", False))
    if shuffle:  # Hydra would shuffle with the global RNG: list them in order instead
        ov = copy.copy(ov)
        ov._value = dataclasses.replace(value, shuffle=False)
    if kind == "RangeSweep":
        count = _range_count(value)
        if count > RANGE_LISTED_MAX:  # e.g. range(0,1e8): 10^8 strings would take gigabytes
            return SweepValues(kind="range", count=count, shuffle=shuffle)
    values = tuple(ov.sweep_string_iterator())
    return SweepValues(kind="range" if kind == "RangeSweep" else "choice",
                       values=values, count=len(values), shuffle=shuffle)


def _range_count(value) -> int:
    """How many values Hydra's range(start, stop, step) yields, without listing them."""
    start, stop, step = value.start, value.stop, value.step
    if not step:
        return 0
    return max(0, math.ceil((stop - start) / step))
