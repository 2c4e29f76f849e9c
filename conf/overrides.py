"""Check command-line overrides against the schema before Hydra sees them.

Hydra stops at the first bad override; this module reports every unknown group option,
unknown key and wrongly typed value at once, each with the valid choices or a close match.
It works on overrides already parsed into plain data (`conf.compose.parse_override`);
`conf.compose.check_overrides` parses the lines and calls `check_override` on each.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from enum import Enum
from typing import TYPE_CHECKING

from conf.errors import ProblemList
from conf.hydra_keys import NO_RUNTIME, hydra_fix, is_hydra_key
from conf.schema import RunConfig
from conf.search_path import group_options

if TYPE_CHECKING:  # conf.compose imports this module: no import back at run time
    from conf.compose.parse import ParsedOverride

GROUPS = ("model", "precision", "parallel", "recompute", "schedule", "optim", "data",
          "cluster", "logging")
OPTIONAL_GROUPS = ("experiment",)  # not in the defaults list: added with +experiment=NAME


def _is_file_path(value: object) -> bool:
    text = str(value)
    return text.endswith((".yaml", ".yml")) or text.startswith(("/", "~", "./", "../"))


def _schema_field(path: list[str]) -> tuple[type | None, str]:
    """Walk the schema along `path`; return (field type, "") or (None, the first bad part)."""
    node: type = RunConfig
    for i, part in enumerate(path):
        if typing.get_origin(node) is dict:
            return typing.get_args(node)[1], ""  # free-form keys, e.g. cluster.env.NCCL_DEBUG
        if not dataclasses.is_dataclass(node):
            return None, ".".join(path[: i + 1])
        hints = typing.get_type_hints(node)
        if part not in hints:
            return None, ".".join(path[: i + 1])
        node = hints[part]
    return node, ""


def _close_keys(path: list[str]) -> list[str]:
    parent, _ = _schema_field(path[:-1]) if len(path) > 1 else (RunConfig, "")
    if parent is None or not dataclasses.is_dataclass(parent):
        return []
    names = [f.name for f in dataclasses.fields(parent)]
    prefix = ".".join(path[:-1] + [""])
    return [prefix + n for n in difflib.get_close_matches(path[-1], names, n=3)]


def _type_problem(kind: type, value: object) -> str:
    """Why `value` cannot be a `kind`, or "" when it can."""
    if isinstance(value, str) and value.startswith("${"):
        return ""  # an interpolation: OmegaConf checks it after resolving
    if isinstance(kind, type) and issubclass(kind, Enum):
        names = [m.name for m in kind]
        return "" if str(value) in names else f"must be one of {', '.join(names)}"
    origin = typing.get_origin(kind)
    if origin is list:
        return "" if isinstance(value, list) else "must be a list, e.g. [a,b]"
    if origin is dict:
        return "" if isinstance(value, dict) else "must be a mapping, e.g. {K: v}"
    if kind is bool:
        return "" if isinstance(value, bool) else "must be true or false"
    if kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return "" if ok else "must be an integer"
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return "" if ok else "must be a number"
    if kind is str:
        return "" if isinstance(value, (str, int, float, bool)) else "must be a string"
    return ""


def check_override(line: str, ov: ParsedOverride | None, syntax_error: str,
                   problems: ProblemList) -> None:
    """Add every reason why one override (`ov`, or None with Hydra's `syntax_error`) cannot
    compose to `problems`."""
    if ov is None:
        problems.add(line, "", f"is not valid override syntax ({syntax_error})",
                     "write key=value, group=option, +key=value or ~key")
        return
    if is_hydra_key(ov.key):  # hydra.run.dir=, hydra/launcher=: meshrun's equivalent instead
        problems.add(ov.key, ov.value_text, NO_RUNTIME, hydra_fix(ov.key, ov.value))
        return
    if ov.is_sweep:
        problems.add(ov.key, ov.value_text,
                     "is a sweep (several values) but `run` takes one value per key",
                     "give a single value, or sweep with `meshrun run -m` or `meshrun sweep`")
        return
    _check_one(ov, problems)


def _check_one(ov: ParsedOverride, problems: ProblemList) -> None:
    key = ov.key
    value = ov.value
    if key in OPTIONAL_GROUPS and not ov.is_add and not ov.is_delete:
        problems.add(key, value, f"{key} is not in the defaults list",
                     f"add it with +{key}={value}")
        return
    if key in GROUPS + OPTIONAL_GROUPS and not ov.is_delete:
        options = group_options(key)
        if _is_file_path(value):
            problems.add(key, value, "is a file path, not an option name",
                         f"put it in DIR/{key}/NAME.yaml and pass --config-dir DIR "
                         f"(or MESHRUN_CONFIG_PATH=DIR), then {key}=NAME")
        elif str(value) not in options:
            problems.add(key, value, f"unknown {key} option",
                         f"choose one of: {', '.join(options)}")
        return
    path = key.split(".")
    kind, bad = _schema_field(path)
    if ov.is_delete or (ov.is_add and kind is not None):
        return  # Hydra's own grammar: checked when composing
    if kind is None and ov.is_add:
        problems.add(key, value, f"cannot add key '{bad}': the run schema is fixed",
                     "set an existing key (see conf/schema.py) without '+'")
        return
    if kind is None:
        close = _close_keys(bad.split("."))
        fix = f"did you mean {' or '.join(close)}?" if close else "see conf/schema.py for keys"
        problems.add(key, value, f"unknown key '{bad}'", fix)
        return
    if dataclasses.is_dataclass(kind):
        problems.add(key, value, "is a config section, not a value",
                     f"set one of its keys, e.g. {key}.{dataclasses.fields(kind)[0].name}=...")
        return
    why = _type_problem(kind, value)
    if why:
        problems.add(key, value, why, f"give a valid {getattr(kind, '__name__', kind)}")
