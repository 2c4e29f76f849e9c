"""Compose many points fast, with exactly the result `conf.compose.compose_config` gives.

A Hydra compose costs ~170 ms here, so a 1,000-point sweep would spend minutes composing.
Points share most of their overrides, so:

- `check_overrides` runs once per distinct override line (it checks each line on its own, so a
  point's problems are the concatenation of its lines' problems, in order: the same message);
- Hydra composes once per combination of config-group choices (`model=tiny +experiment=smoke`);
  the key=value overrides are then applied the way Hydra applies them (after the defaults);
- a key=value override of a plain leaf (not a list, dict, interpolation or add/delete) is
  converted once per distinct line by OmegaConf against the schema, and then set on a copy of
  the composed dataclass: no OmegaConf work per point at all.

Anything unusual (a failure, a key that an interpolation reads) falls back to
`compose_config` itself, so errors carry the single-run message. A test compares both paths.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import re
import typing

from conf.compose import SCHEMA_NAME, compose_config
from conf.errors import ConfigError, Problem
from conf.overrides import CONF_DIR, GROUPS, OPTIONAL_GROUPS, check_overrides
from conf.schema import RunConfig


class ComposeCache:
    def __init__(self) -> None:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        self.parser = OverridesParser.create()
        self.line_problems: dict[str, list[Problem]] = {}
        self.parsed: dict[str, object] = {}
        self.bases: dict[tuple[str, ...], tuple[object, RunConfig, str] | None] = {}
        self.leaves: dict[str, object] = {}
        self.stats = {"hydra": 0, "fast": 0, "merged": 0, "fallback": 0}

    def compose(self, overrides: list[str] | tuple[str, ...],
                settings: dict[str, object] | None = None) -> RunConfig:
        """compose_config(overrides + `key=value` per settings entry), sharing work with earlier
        calls. `settings` (a sweep's run name, W&B group and tags: strings, lists of strings)
        are set on the result directly: such values convert to themselves, and no two points
        share them, so parsing them would cost ~5 ms per point for nothing."""
        config = self._compose(overrides)
        for key, value in (settings or {}).items():
            *parents, leaf = key.split(".")
            node = config
            for part in parents:
                node = getattr(node, part)
            setattr(node, leaf, copy.copy(value))
        return config

    def _compose(self, overrides: list[str] | tuple[str, ...]) -> RunConfig:
        problems = [p for line in overrides for p in self._check(line)]
        if problems:
            raise ConfigError(problems, "Invalid overrides")
        parsed = [self.parsed[line] for line in overrides]
        groups = tuple(line for line, ov in zip(overrides, parsed) if _is_group(ov))
        values = [ov for ov in parsed if not _is_group(ov)]
        base = self._base(groups)
        if base is None:
            return self._fallback(overrides)
        dict_cfg, run_config, interpolations = base  # interpolations: the keys they read
        try:
            if all(self._is_leaf(ov, interpolations) for ov in values):
                self.stats["fast"] += 1
                return self._set_leaves(run_config, values)
            self.stats["merged"] += 1
            return self._merge(dict_cfg, values)
        except Exception:  # noqa: BLE001 - the exact message comes from the real path
            return self._fallback(overrides)

    def _check(self, line: str) -> list[Problem]:
        if line not in self.line_problems:
            try:
                check_overrides([line])
                (self.parsed[line],) = self.parser.parse_overrides([line])
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

    def _is_leaf(self, ov, interpolations: str) -> bool:
        if ov.is_add() or ov.is_delete() or ov.is_force_add() or ov.package is not None:
            return False
        key, value = ov.key_or_group, ov.value()
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

    def _set_leaves(self, run_config: RunConfig, values: list) -> RunConfig:
        out = copy.deepcopy(run_config)
        for ov in values:
            line = ov.input_line
            if line not in self.leaves:
                self.leaves[line] = _converted_leaf(ov)
            *parents, leaf = ov.key_or_group.split(".")
            node = out
            for part in parents:
                node = getattr(node, part)
            setattr(node, leaf, copy.copy(self.leaves[line]))
        return out

    def _merge(self, dict_cfg, values: list) -> RunConfig:
        from hydra._internal.config_loader_impl import ConfigLoaderImpl
        from omegaconf import OmegaConf

        cfg = copy.deepcopy(dict_cfg)
        ConfigLoaderImpl._apply_overrides_to_config(values, cfg)
        result = OmegaConf.to_object(cfg)
        assert isinstance(result, RunConfig)
        return result

    def _fallback(self, overrides) -> RunConfig:
        self.stats["fallback"] += 1
        return compose_config(list(overrides))


def _is_group(ov) -> bool:
    return ov.key_or_group in GROUPS + OPTIONAL_GROUPS or ov.package is not None


def _compose_groups(groups: list[str]):
    """Hydra's compose of the group choices: (DictConfig, RunConfig, interpolation texts)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(name=SCHEMA_NAME, node=RunConfig)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=groups)
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


def _converted_leaf(ov):
    """The value OmegaConf stores for this override (type conversion against the schema)."""
    from omegaconf import OmegaConf

    *parents, leaf = ov.key_or_group.split(".")
    node_type = RunConfig
    for part in parents:
        node_type = typing.get_type_hints(node_type)[part]
    section = OmegaConf.structured(node_type)
    OmegaConf.update(section, leaf, ov.value(), merge=True)
    return getattr(OmegaConf.to_object(section), leaf)
