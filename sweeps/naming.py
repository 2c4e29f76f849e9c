"""Run names from a template, W&B group and tags, and quoting values for Hydra overrides."""
from __future__ import annotations

import re

from conf.errors import ProblemList

WANDB_TAG_MAX = 64
FIELD = re.compile(r"\{([^{}]*)\}")


def display(parser, key: str, value_text: str) -> str:
    """A value as shown in tables, names and tags: quotes removed, numbers as Hydra reads them."""
    try:
        (ov,) = parser.parse_overrides([f"{key.lstrip('+~')}={value_text}"])
        value = ov.value()
    except Exception:  # noqa: BLE001 - shown as written; validation reports it properly
        return value_text
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    return str(value) if isinstance(value, (str, int, float)) else value_text


def default_template(keys: list[str]) -> str:
    shorts = [k.split(".")[-1] for k in keys]
    parts = [f"{s if shorts.count(s) == 1 else k}={{{k}}}" for k, s in zip(keys, shorts)]
    return "-".join(parts) or "{sweep}-{index}"


def _fields(values: dict[str, str], fixed: dict[str, str], *, sweep: str,
            index: int) -> dict[str, str]:
    """Template fields: {sweep}, {index}, every key of the base and the varied keys (by full
    key, or by its last part when that is unambiguous); varied values win."""
    fields = {"sweep": sweep, "index": str(index)}
    for source in (values, fixed):
        shorts = [k.split(".")[-1] for k in source]
        for key, value in source.items():
            fields.setdefault(key, value)
            if shorts.count(key.split(".")[-1]) == 1:
                fields.setdefault(key.split(".")[-1], value)
    return fields


def base_values(base: tuple[str, ...], parser) -> dict[str, str]:
    out = {}
    for line in base:
        try:
            (ov,) = parser.parse_overrides([line])
        except Exception:  # noqa: BLE001 - reported by validation
            continue
        if not ov.is_sweep_override() and not ov.is_delete():
            out[ov.key_or_group] = display(parser, ov.key_or_group, ov.get_value_element_as_str())
    return out


def check_template(template: str, keys: list[str], fixed: dict[str, str],
                   problems: ProblemList) -> None:
    known = _fields(dict.fromkeys(keys, ""), fixed, sweep="", index=0)
    for field in FIELD.findall(template):
        if field not in known:
            problems.add("run_name", template, f"names an unknown field {{{field}}}",
                         "use {sweep}, {index}, or a key the sweep sets, e.g. "
                         + ", ".join("{" + k + "}" for k in keys[:4]))


def render_name(template: str, values: dict[str, str], fixed: dict[str, str], *, sweep: str,
                index: int) -> str:
    fields = _fields(values, fixed, sweep=sweep, index=index)
    return FIELD.sub(lambda m: fields.get(m.group(1), ""), template)  # list points may lack a key


def wandb_group_and_tags(overrides: tuple[str, ...], *, group: str, values: dict[str, str],
                         parser) -> tuple[str, tuple[str, ...]]:
    """The W&B group (unless the base sets one) and tags: the base's, then the varied values."""
    given = {}
    for line in overrides:
        try:
            (ov,) = parser.parse_overrides([line])
        except Exception:  # noqa: BLE001 - reported by validation
            continue
        given[ov.key_or_group] = ov.value()
    tags = [str(t) for t in given.get("logging.wandb_tags") or []
            if isinstance(t, (str, int, float))]
    tags += [f"{key}={value}"[:WANDB_TAG_MAX] for key, value in values.items()]
    return ("" if "logging.wandb_group" in given else group), tuple(tags)


def hydra_quote(text: str) -> str:
    """`text` as a single-quoted Hydra string that parses back to exactly `text`."""
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"
