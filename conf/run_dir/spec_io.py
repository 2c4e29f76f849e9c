"""RunSpec <-> JSON. spec.json is what every rank reads; it round-trips exactly."""
from __future__ import annotations

import dataclasses
import json
import typing
from enum import Enum
from pathlib import Path

from conf.spec import RunSpec


def spec_to_dict(spec: object) -> dict:
    """Nested plain dict (Enums as their values, tuples as lists)."""
    out = {}
    for f in dataclasses.fields(spec):
        out[f.name] = _plain(getattr(spec, f.name))
    return out


def _plain(value: object) -> object:
    if dataclasses.is_dataclass(value):
        return spec_to_dict(value)
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


def spec_from_dict(cls: type, data: dict) -> object:
    """Rebuild a frozen spec dataclass (recursively) from `spec_to_dict` output. A field that
    a spec.json written by an older meshrun lacks takes its default when the spec declares one
    (every knob but conf.spec.FIRST_SPEC_JSON_KNOBS does)."""
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data and _has_default(f):
            continue
        kwargs[f.name] = _typed(hints[f.name], data[f.name])
    return cls(**kwargs)


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _typed(kind: object, value: object) -> object:
    if dataclasses.is_dataclass(kind):
        return spec_from_dict(kind, value)
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(value)
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        return tuple(spec_from_dict(item, v) if dataclasses.is_dataclass(item) else v
                     for v in value)
    return value


def write_spec(spec: RunSpec, path: Path) -> None:
    path.write_text(json.dumps(spec_to_dict(spec), indent=2, sort_keys=False) + "\n")


def read_spec(path: Path) -> RunSpec:
    return spec_from_dict(RunSpec, json.loads(Path(path).read_text()))
