"""Run names from a template, and each point's W&B group and tags."""
from __future__ import annotations

import re

from conf.compose import display_value, try_parse_override
from conf.errors import ProblemList

WANDB_TAG_MAX = 64
FIELD = re.compile(r"\{([^{}]*)\}")


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


def base_values(base: tuple[str, ...]) -> dict[str, str]:
    """Key -> value as shown, of each single-value base override (template fields)."""
    out = {}
    for line in base:
        ov, _ = try_parse_override(line)  # a syntax error is reported by validation
        if ov is not None and not ov.is_sweep and not ov.is_delete:
            out[ov.key] = display_value(ov.key, ov.value_str)
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


def wandb_group_and_tags(overrides: tuple[str, ...], *, group: str,
                         values: dict[str, str]) -> tuple[str, tuple[str, ...]]:
    """The W&B group (unless the base sets one) and tags: the base's, then the varied values."""
    given = {}
    for line in overrides:
        ov, _ = try_parse_override(line)  # a syntax error is reported by validation
        if ov is not None:
            given[ov.key] = ov.value
    tags = [str(t) for t in given.get("logging.wandb_tags") or []
            if isinstance(t, (str, int, float))]
    tags += [f"{key}={value}"[:WANDB_TAG_MAX] for key, value in values.items()]
    return ("" if "logging.wandb_group" in given else group), tuple(tags)



NAME_KEY = "name"


def point_template(run_name: str, keys: list[str], fixed: dict[str, str]) -> str:
    """The run-name template of a point varying `keys`: the sweep's run_name; else, when the
    user set `name=` (fixed, or an axis), that name kept and made unique per point: a name
    with {fields} is itself the template, a plain one gets the varied values appended
    ("{name}-lr={optim.lr}"); else the varied values (default_template)."""
    if run_name:
        return run_name
    others = [k for k in keys if k != NAME_KEY]
    if NAME_KEY in keys:
        return "-".join(["{name}", default_template(others)] if others else ["{name}"])
    given = fixed.get(NAME_KEY)
    if given is None:
        return default_template(keys)
    if FIELD.search(given):
        return given
    return "-".join(["{name}", default_template(keys)] if keys else ["{name}"])


def check_user_name(run_name: str, keys: list[str], fixed: dict[str, str],
                    problems: ProblemList) -> None:
    """A user's name= is never silently replaced: a run_name template that does not use
    {name} would replace it in every point."""
    given = fixed.get(NAME_KEY) if NAME_KEY not in keys else "(an axis)"
    if given is None or not run_name or "{name}" in run_name:
        return
    problems.add(NAME_KEY, given, f"is set, and the sweep's run_name template {run_name!r} "
                 "would replace it in every point",
                 "put {name} in the template (e.g. '{name}-{index}'), or drop name= or "
                 "run_name")


def check_unique_names(names: list[str], problems: ProblemList) -> None:
    """Points named after the user's name= must stay distinguishable."""
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    for name, count in seen.items():
        if count > 1:
            problems.add(NAME_KEY, name, f"would name {count} points the same",
                         "vary the name per point: put {index} or a varied key in it "
                         "(e.g. name='run-{index}')")
