"""Compose conf/ + overrides with Hydra into a typed RunConfig. The only module that uses Hydra.

`DictConfig` never leaves this module: callers get a plain `RunConfig` dataclass.
"""
from __future__ import annotations

from omegaconf import OmegaConf

from conf.errors import ConfigError, Problem
from conf.overrides import CONF_DIR, check_overrides
from conf.schema import RunConfig

SCHEMA_NAME = "run_schema"


def _register_schema() -> None:
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=RunConfig)


def compose_config(overrides: list[str]) -> RunConfig:
    """Compose the default config with `overrides`; raise ConfigError on any bad override."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    check_overrides(overrides)
    _register_schema()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="config", overrides=list(overrides))
        run_config = OmegaConf.to_object(cfg)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError([_problem_from_hydra(err)], "Invalid overrides") from None
    assert isinstance(run_config, RunConfig), type(run_config)
    return run_config


def config_yaml(run_config: RunConfig) -> str:
    """The composed config as YAML (what `config.yaml` in the run dir holds)."""
    return OmegaConf.to_yaml(OmegaConf.structured(run_config))


def _problem_from_hydra(err: Exception) -> Problem:
    """One Problem from a Hydra/OmegaConf error, keyed by the config key it names if any."""
    errors = [e for e in (err, err.__cause__) if e is not None]
    key = next((e.full_key for e in errors if getattr(e, "full_key", None)), "")
    texts = [" ".join(str(e).split("full_key:")[0].split()) for e in errors if str(e).strip()]
    text = texts[-1] if texts else type(err).__name__
    return Problem(key or "overrides", "", text,
                   "check the keys and values against conf/schema.py")
