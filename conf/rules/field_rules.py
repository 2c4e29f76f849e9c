"""Rules on single knobs of every section, by type: non-finite floats, mistyped list items,
positive values. Torch-free, like every rule file (see conf/rules/__init__.py)."""
from __future__ import annotations

import math
from dataclasses import MISSING, fields, is_dataclass, replace

from conf.errors import ProblemList


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n > 0 else []


def check_positive(problems: ProblemList, section: str, obj: object,
                   names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            problems.add(f"{section}.{name}", value, "must be positive", "give a value > 0")


FINITE_RULE = "must be a finite number (nan and inf are refused)"
INT64_MAX = 2**63 - 1
INT64_RULE = f"must fit a signed 64-bit integer (|value| <= {INT64_MAX})"


def repair_fields(cfg, problems: ProblemList, check, prefix: str = ""):
    """Walk every field of every config section; `check(f, value, key, problems)` returns True
    when it reported the field as bad. A copy of `cfg` comes back with each bad field replaced
    by its schema default, so the rules after it see sane values (one problem per key)."""
    bad = {}
    for f in fields(cfg):
        value, key = getattr(cfg, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            fixed = repair_fields(value, problems, check, prefix=f"{key}.")
            if fixed is not value:
                bad[f.name] = fixed
        elif check(f, value, key, problems):
            bad[f.name] = _schema_default(f)
    return replace(cfg, **bad) if bad else cfg


def _schema_default(f):
    return f.default_factory() if f.default_factory is not MISSING else f.default


def finite_floats(cfg, problems: ProblemList):
    """Every float knob of every section, in one place: NaN slips through any `value <= 0`
    test and inf through any upper-bound-free one, so each non-finite float is reported here
    and replaced by its schema default. A float field added to any schema section is covered
    without being named."""
    return repair_fields(cfg, problems, _non_finite)


def _non_finite(f, value, key: str, problems: ProblemList) -> bool:
    if isinstance(value, list):
        return _non_finite_items(f, value, key, problems)
    if not isinstance(value, float) or math.isfinite(value):
        return False
    problems.add(key, value, FINITE_RULE,
                 f"give a finite value, e.g. the default {_schema_default(f)}")
    return True


def int64_ints(cfg, problems: ProblemList):
    """Every int knob of every section fits int64: torch tensors, JSON readers of other
    languages and the step counters all hold int64, so 2**63 or 2**80 would wrap or fail in
    the ranks. Reported here and replaced by the schema default, like a non-finite float."""
    return repair_fields(cfg, problems, _beyond_int64)


def _beyond_int64(f, value, key: str, problems: ProblemList) -> bool:
    if not isinstance(value, int) or isinstance(value, bool) or abs(value) <= INT64_MAX:
        return False
    problems.add(key, _short_int(value), INT64_RULE,
                 f"give a value that means something here, e.g. the default {_schema_default(f)}")
    return True


def _short_int(value: int) -> str:
    """A huge int shown readably: 2**80 as '1208925819614629174706176 (about 2^80)'."""
    return f"{value} (about 2^{abs(value).bit_length() - 1})"


def _non_finite_items(f, value: list, key: str, problems: ProblemList) -> bool:
    """A list of floats (data.weights) holds only finite numbers."""
    bad = [v for v in value if isinstance(v, float) and not math.isfinite(v)]
    if not bad:
        return False
    problems.add(key, value, f"{FINITE_RULE}: found {bad[0]}",
                 "give finite numbers, e.g. [0.7,0.3]")
    return True


_ITEM_TYPES = {"list[str]": (str,), "list[int]": (int,), "dict[str, str]": (str,)}


def typed_lists(cfg, problems: ProblemList):
    """Every list (and str->str dict) knob holds items of its declared type. OmegaConf lets a
    nested list (`recompute.targets=[[a]]`) into a list[str] field; each such knob is reported
    here and replaced by its schema default, so the other rules see the declared types."""
    return repair_fields(cfg, problems, _mistyped_items)


def _mistyped_items(f, value, key: str, problems: ProblemList) -> bool:
    wanted = _ITEM_TYPES.get(str(f.type).replace("typing.", ""))
    if wanted is None or not isinstance(value, (list, dict)):
        return False
    items = list(value.values()) if isinstance(value, dict) else value
    odd = [v for v in items if not isinstance(v, wanted) or isinstance(v, bool)]
    if not odd:
        return False
    name = wanted[0].__name__
    if isinstance(value, list):
        problems.add(key, value, f"must be a flat list of {name} values (found {odd[0]!r})",
                     f"write {key}=[a,b] (no nested lists)")
    else:
        problems.add(key, value, f"values must be {name} (found {odd[0]!r})",
                     f"give {name} values")
    return True
