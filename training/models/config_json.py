"""Typed reads of a Hugging Face config.json, for the families' `read_hf_config`. Torch-free.

JSON says little about types: "64", 64.5, true, NaN and 1e400 all parse. A model knob comes out
of here only as what it means (an integer >= 1, a finite float, a JSON boolean, a string);
anything else is a refusal naming the key and the value, and the reader goes on so that every
bad key is named at once. A key absent where transformers itself has no default is a refusal.
"""
from __future__ import annotations

import json
import math

MISSING = object()
MAX_SIZE = 2**31 - 1
"""Sizes (layers, widths, heads, vocabulary) above this describe no model that fits anywhere."""


class ConfigFields:
    """Reads keys of one config.json object (or a nested one, `prefix` naming it), collecting
    refusals; a bad value reads as a harmless stand-in so the caller can go on."""

    def __init__(self, data: dict, *, prefix: str = "", refusals: list[str] | None = None):
        self.data = data
        self.prefix = prefix
        self.refusals = [] if refusals is None else refusals
        self.bad: set[str] = set()
        """The keys refused so far (a rule between keys skips them)."""

    def refuse(self, key: str, value: object, rule: str) -> None:
        shown = " is missing" if value is MISSING else f"={_json(value)}"
        self.bad.add(key)
        self.refusals.append(f"{self.prefix}{key}{shown}: {rule}")

    def get(self, key: str, default: object = MISSING) -> object:
        value = self.data.get(key, default)
        return default if value is None and default is not MISSING else value

    def size(self, key: str, default: object = MISSING, *, minimum: int = 1) -> int:
        value = self.get(key, default)
        if type(value) is not int or not minimum <= value <= MAX_SIZE:
            self.refuse(key, value, f"must be an integer from {minimum} to {MAX_SIZE}")
            return max(minimum, 1)
        return value

    def number(self, key: str, default: object = MISSING, *, positive: bool = True) -> float:
        value = self.get(key, default)
        ok = type(value) in (int, float) and math.isfinite(value) and (value > 0 or not positive)
        if not ok:
            self.refuse(key, value, f"must be a finite {'positive ' if positive else ''}number")
            return 1.0
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if type(value) is not bool:
            self.refuse(key, value, "must be true or false")
            return default
        return value

    def text(self, key: str, default: object = MISSING) -> str:
        value = self.get(key, default)
        if not isinstance(value, str):
            self.refuse(key, value, "must be a string")
            return ""
        return value

    def section(self, key: str) -> ConfigFields:
        """The nested object under `key` (absent or null: empty), read with the same refusals."""
        value = self.data.get(key)
        if value is not None and not isinstance(value, dict):
            self.refuse(key, value, "must be an object")
        return ConfigFields(value if isinstance(value, dict) else {}, prefix=f"{key}.",
                            refusals=self.refusals)


def _json(value: object) -> str:
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."
