"""Compose conf/ + one run's overrides with Hydra into a typed RunConfig.

`DictConfig` never leaves this package: callers get a plain `RunConfig` dataclass.
"""
from __future__ import annotations

from conf.compose.parse import quote_value, try_parse_override
from conf.errors import ConfigError, Problem, ProblemList
from conf.overrides import check_override
from conf.schema import RunConfig
from conf.search_path import CONF_DIR, SEARCHPATH_KEY, hydra_searchpath

SCHEMA_NAME = "run_schema"
CONFIG_NAME = "config"
HYDRA_VERSION_BASE = "1.3"


def compose_config(overrides: list[str]) -> RunConfig:
    """Compose the default config with `overrides`; raise ConfigError on any bad override."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    check_overrides(overrides)
    try:
        cfg = compose_dict_config(list(overrides))
        run_config = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError([_problem_from_hydra(err)], "Invalid overrides") from None
    assert isinstance(run_config, RunConfig), type(run_config)
    return run_config


def check_overrides(overrides: list[str]) -> None:
    """Raise one ConfigError listing every override that cannot compose (syntax, sweeps, unknown
    group options and keys, wrong types), before Hydra, which stops at the first, sees them."""
    problems = ProblemList()
    for line in overrides:
        check_override(line, *try_parse_override(line), problems)
    problems.raise_if_any("Invalid overrides")


def config_yaml(run_config: RunConfig) -> str:
    """The composed config as YAML (what `config.yaml` in the run dir holds)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(run_config))


def compose_dict_config(overrides: list[str]):
    """Hydra's public compose of conf/config.yaml with `overrides`: a DictConfig, for this
    package only. The user config dirs (conf.search_path) are Hydra's search path after
    conf/. Raises Hydra's and OmegaConf's own errors."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=RunConfig)
    extra = hydra_searchpath()
    if extra:
        overrides = [f"{SEARCHPATH_KEY}=[{','.join(quote_value(p) for p in extra)}]",
                     *overrides]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=HYDRA_VERSION_BASE):
        return compose(config_name=CONFIG_NAME, overrides=overrides)


def _problem_from_hydra(err: Exception) -> Problem:
    """One Problem from a Hydra/OmegaConf error, keyed by the config key it names if any."""
    errors = [e for e in (err, err.__cause__) if e is not None]
    key = next((e.full_key for e in errors if getattr(e, "full_key", None)), "")
    texts = [" ".join(str(e).split("full_key:")[0].split()) for e in errors if str(e).strip()]
    text = texts[-1] if texts else type(err).__name__
    return Problem(key or "overrides", "", text,
                   "check the keys and values against conf/schema.py")
