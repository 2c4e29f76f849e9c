"""The composed config as `--cfg` prints it, the way Hydra's `show_cfg` does: interpolations as
written (`name: ${model.name}`) unless `resolve`, `package` selecting a subtree (printed under
`# @package PKG`) or a single value (printed alone).

Callers get and give plain data (dicts, lists, strings, numbers); nothing of OmegaConf leaves.
"""
from __future__ import annotations

from dataclasses import dataclass

from conf.compose.single import check_overrides, compose_dict_config, hydra_errors_as_problems
from conf.errors import ConfigError, Problem

GLOBAL_PACKAGE = "_global_"  # Hydra's name for the root: the same as no package


@dataclass(frozen=True, slots=True, kw_only=True)
class PrintableConfig:
    """One composed config, as plain data."""

    tree: dict
    """The config, interpolations kept as written (`${model.name}`), enums by name."""
    resolved: dict
    """The same, interpolations resolved."""
    choices: dict[str, str]
    """Config group -> the option composed (Hydra's runtime.choices, without its own groups)."""


def compose_printable(overrides: list[str]) -> PrintableConfig:
    """Compose `overrides` as compose_config does (same checks, same ConfigError), as data."""
    from omegaconf import OmegaConf, flag_override

    check_overrides(overrides)
    with hydra_errors_as_problems():
        cfg = compose_dict_config(list(overrides), with_hydra_node=True)
        choices = {str(group): str(option)
                   for group, option in cfg.hydra.runtime.choices.items()
                   if option is not None and not str(group).startswith("hydra/")}
        with flag_override(cfg, ["struct", "readonly"], [False, False]):
            del cfg["hydra"]
        tree = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
        resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return PrintableConfig(tree=tree, resolved=resolved, choices=choices)


def config_text(tree: dict, *, package: str | None = None, resolve: bool = False,
                missing_fix: str = "") -> str:
    """`tree` as Hydra's --cfg prints it: YAML, or the `package` subtree under `# @package`,
    or a single value alone. A package not in `tree` is a ConfigError (`missing_fix`, or the
    keys found where it stops)."""
    from omegaconf import Container, OmegaConf

    with hydra_errors_as_problems():
        cfg = OmegaConf.create(tree)
        package = None if package in (None, "", GLOBAL_PACKAGE) else package
        chosen = cfg if package is None else OmegaConf.select(cfg, package)
        if chosen is None:
            raise ConfigError([Problem("--package", package, "is not a key of the printed config",
                                       missing_fix or _keys_near(tree, package))], "Bad command")
        if not isinstance(chosen, Container):
            return f"{chosen}\n"
        if resolve:
            OmegaConf.resolve(chosen)
        head = f"# @package {package}\n" if package is not None else ""
        return head + OmegaConf.to_yaml(chosen)


def _keys_near(tree: dict, package: str) -> str:
    """The keys where the dotted `package` stops matching, as a fix."""
    node, done = tree, []
    for part in package.split("."):
        if not isinstance(node, dict) or part not in node:
            break
        node, done = node[part], done + [part]
    if not isinstance(node, dict) or not node:
        return f"{'.'.join(done)} holds a value, not keys" if done else "give a key of the config"
    prefix = ".".join(done + [""])
    return "choose one of: " + ", ".join(prefix + str(k) for k in node)
