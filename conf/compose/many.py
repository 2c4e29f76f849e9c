"""Compose many runs (a sweep's points) fast, with exactly the results `compose_config` gives.

A Hydra compose costs 100-300 ms here, even inside one `initialize_config_dir`, so a
1,000-point sweep would spend minutes composing; this module composes 200 points in 0.2-1.3 s
(17-145x faster: `benchmarks/compose_many_time.py`). Points share most of their overrides, so:

- the override checks run once per distinct override line (each line is checked on its own,
  so a point's problems are its lines' problems, in order: the single-run message);
- Hydra composes once per combination of config-group choices (`model=tiny +experiment=smoke`);
  the key=value overrides are then applied the way Hydra applies them (after the defaults);
- a key=value override of a plain leaf (not a list, dict, interpolation or add/delete) is
  converted once per distinct line by OmegaConf against the schema, and then set on a copy of
  the composed dataclass: no OmegaConf work per point at all.

Anything unusual (a failure, a key that an interpolation reads, a Hydra without the private
hook that `_apply_overrides` calls) falls back to `compose_config` itself, so errors carry the
single-run message. tests/sweeps/test_sweep_validate.py compares both paths.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import re
import typing
from collections.abc import Sequence

from conf.compose.parse import ParsedOverride, _hydra_override, parse_override
from conf.compose.single import check_overrides, compose_config, compose_dict_config
from conf.errors import ConfigError, Problem
from conf.overrides import GROUPS, OPTIONAL_GROUPS
from conf.schema import RunConfig


def compose_many(override_lists: Sequence[Sequence[str]], *,
                 settings: Sequence[dict[str, object]] | None = None,
                 stats: dict[str, int] | None = None) -> list[RunConfig | ConfigError]:
    """`compose_config(overrides)` for each override list, sharing Hydra work between them.

    Returns, per list and in order, the RunConfig or the ConfigError that `compose_config`
    raises for it (same problems, same title), so one bad point never hides the others.

    `settings` (one dict per list, or None): values the caller sets on top of its overrides,
    by dotted key (a sweep's run name, W&B group and tags: strings, lists of strings). The
    result equals composing the overrides plus `key=<quoted value>`; they are set directly,
    since no two points share them and parsing them would cost ~5 ms per point for nothing.
    `stats` (optional): counts of how points were composed are added to it: "hydra" (distinct
    group choices composed), "fast" (leaves set), "merged" (overrides merged by Hydra's
    rules), "fallback" (a full compose_config).
    """
    composer = _Composer()
    out: list[RunConfig | ConfigError] = []
    for i, overrides in enumerate(override_lists):
        try:
            out.append(composer.compose(overrides, settings[i] if settings else None))
        except ConfigError as err:
            out.append(err)
    if stats is not None:
        for key, count in composer.stats.items():
            stats[key] = stats.get(key, 0) + count
    return out


class _Composer:
    """The caches of one compose_many call."""

    def __init__(self) -> None:
        self.line_problems: dict[str, list[Problem]] = {}
        self.bases: dict[tuple[str, ...], tuple[object, RunConfig, tuple[str, ...]] | None] = {}
        self.leaves: dict[str, object] = {}
        self.stats = {"hydra": 0, "fast": 0, "merged": 0, "fallback": 0}

    def compose(self, overrides: Sequence[str],
                settings: dict[str, object] | None) -> RunConfig:
        config = self._compose(overrides)
        for key, value in (settings or {}).items():
            _set_path(config, key, copy.copy(value))
        return config

    def _compose(self, overrides: Sequence[str]) -> RunConfig:
        problems = [p for line in overrides for p in self._check(line)]
        if problems:
            raise ConfigError(problems, "Invalid overrides")
        parsed = [parse_override(line) for line in overrides]
        groups = tuple(ov.line for ov in parsed if _is_group(ov))
        values = [ov for ov in parsed if not _is_group(ov)]
        base = self._base(groups)
        if base is None:
            return self._fallback(overrides)
        dict_cfg, run_config, interpolations = base  # interpolations: the keys they read
        try:
            if all(_is_leaf(ov, interpolations) for ov in values):
                config = self._set_leaves(run_config, values)
                self.stats["fast"] += 1
                return config
            config = _merge(dict_cfg, [ov.line for ov in values])
        except Exception:  # noqa: BLE001 - the exact message comes from the real path
            return self._fallback(overrides)
        if config is None:  # Hydra's private hook is gone: compose the public way
            return self._fallback(overrides)
        self.stats["merged"] += 1
        return config

    def _check(self, line: str) -> list[Problem]:
        if line not in self.line_problems:
            try:
                check_overrides([line])
                self.line_problems[line] = []
            except ConfigError as err:
                self.line_problems[line] = err.problems
        return self.line_problems[line]

    def _base(self, groups: tuple[str, ...]):
        if groups not in self.bases:
            self.bases[groups] = None
            try:
                self.bases[groups] = _compose_groups(list(groups))
                self.stats["hydra"] += 1
            except Exception:  # noqa: BLE001 - each point falls back and reports it
                pass
        return self.bases[groups]

    def _set_leaves(self, run_config: RunConfig, values: list[ParsedOverride]) -> RunConfig:
        out = copy.deepcopy(run_config)
        for ov in values:
            if ov.line not in self.leaves:
                self.leaves[ov.line] = _converted_leaf(ov)
            _set_path(out, ov.key, copy.copy(self.leaves[ov.line]))
        return out

    def _fallback(self, overrides: Sequence[str]) -> RunConfig:
        self.stats["fallback"] += 1
        return compose_config(list(overrides))


def _apply_overrides(dict_cfg, lines: list[str]) -> bool:
    """Apply key=value override lines to a composed DictConfig in place, exactly as Hydra's
    compose applies them after the defaults list (add, force-add, delete, merge into dicts).

    This is the ONE call of Hydra's private API in meshrun: hydra-core 1.3's
    `ConfigLoaderImpl._apply_overrides_to_config`. It exists because composing each sweep point
    the public way (`hydra.compose` per point, one `initialize_config_dir`) is 17x slower even
    for the points that need this hook, 37-145x for the rest (benchmarks/compose_many_time.py).
    Returns False, having changed nothing, when this Hydra lacks the hook; the caller then
    composes the point the public way (`compose_config`).
    """
    try:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl

        apply = ConfigLoaderImpl._apply_overrides_to_config
    except (ImportError, AttributeError):
        return False
    apply([_hydra_override(line) for line in lines], dict_cfg)
    return True


def _merge(dict_cfg, lines: list[str]) -> RunConfig | None:
    """A copy of the composed `dict_cfg` with `lines` applied, as a RunConfig; None when
    Hydra's private hook is unavailable."""
    from omegaconf import OmegaConf

    cfg = copy.deepcopy(dict_cfg)
    if not _apply_overrides(cfg, lines):
        return None
    result = OmegaConf.to_object(cfg)
    assert isinstance(result, RunConfig)
    return result


def _set_path(config: RunConfig, key: str, value: object) -> None:
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        node = getattr(node, part)
    setattr(node, leaf, value)


def _is_group(ov: ParsedOverride) -> bool:
    return ov.key in GROUPS + OPTIONAL_GROUPS or ov.package is not None


def _is_leaf(ov: ParsedOverride, interpolations: tuple[str, ...]) -> bool:
    """Whether setting the converted value on the composed dataclass is all Hydra would do."""
    if ov.is_add or ov.is_delete or ov.is_force_add or ov.package is not None:
        return False
    key, value = ov.key, ov.value
    if isinstance(value, str) and ("${" in value or value == "???"):
        return False
    if not isinstance(value, (str, int, float, list)):
        return False
    if "*" in interpolations or any(
            key == ref or ref.startswith(key + ".") or key.startswith(ref + ".")
            for ref in interpolations):
        return False
    kind = _leaf_type(key)
    if kind is None or dataclasses.is_dataclass(kind) or typing.get_origin(kind) is dict:
        return False  # a dict override merges into the dict: Hydra's path does that
    if typing.get_origin(kind) is list:  # a list override replaces the list
        return isinstance(value, list) and all(
            isinstance(v, (str, int, float)) and "${" not in str(v) for v in value)
    return True


def _compose_groups(groups: list[str]) -> tuple[object, RunConfig, tuple[str, ...]]:
    """Hydra's compose of the group choices: (DictConfig, RunConfig, interpolated keys)."""
    from omegaconf import OmegaConf

    cfg = compose_dict_config(groups)
    run_config = OmegaConf.to_object(cfg)
    assert isinstance(run_config, RunConfig)
    raw = OmegaConf.to_container(cfg, resolve=False)
    return cfg, run_config, _interpolated_keys(raw)


INTERPOLATION = re.compile(r"\$\{([^{}:]+)\}")


def _interpolated_keys(node) -> tuple[str, ...]:
    """Keys that interpolations read (`${model.name}` -> model.name): overriding one of them
    changes other values, which only Hydra's own path gets right."""
    if isinstance(node, dict):
        return tuple(k for v in node.values() for k in _interpolated_keys(v))
    if isinstance(node, list):
        return tuple(k for v in node for k in _interpolated_keys(v))
    if isinstance(node, str) and "${" in node:
        found = INTERPOLATION.findall(node)
        return tuple(found) if found and node.count("${") == len(found) else ("*",)
    return ()


@functools.lru_cache(maxsize=None)
def _leaf_type(key: str):
    """The schema type of a dotted key, or None when it is not a field of the schema."""
    node = RunConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(node):
            return None
        hints = typing.get_type_hints(node)
        if part not in hints:
            return None
        node = hints[part]
    return node


def _converted_leaf(ov: ParsedOverride):
    """The value OmegaConf stores for this override (type conversion against the schema)."""
    from omegaconf import OmegaConf

    *parents, leaf = ov.key.split(".")
    node_type = RunConfig
    for part in parents:
        node_type = typing.get_type_hints(node_type)[part]
    section = OmegaConf.structured(node_type)
    OmegaConf.update(section, leaf, ov.value, merge=True)
    return getattr(OmegaConf.to_object(section), leaf)
