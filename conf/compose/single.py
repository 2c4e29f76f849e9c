"""Compose conf/ + one run's overrides with Hydra into a typed RunConfig.

`DictConfig` never leaves this package: callers get a plain `RunConfig` dataclass.
"""
from __future__ import annotations

import contextlib
import re

from conf.compose.parse import quote_value, try_parse_override
from conf.errors import ConfigError, Problem, ProblemList
from conf.overrides import check_override
from conf.schema import RunConfig
from conf.search_path import (CONF_DIR, SEARCHPATH_KEY, hydra_searchpath, option_sources,
                               user_config_dirs)

SCHEMA_NAME = "run_schema"
CONFIG_NAME = "config"
HYDRA_VERSION_BASE = "1.3"


def compose_config(overrides: list[str]) -> RunConfig:
    """Compose the default config with `overrides`; raise ConfigError on any bad override."""
    from omegaconf import OmegaConf

    check_overrides(overrides)
    with hydra_errors_as_problems():
        run_config = OmegaConf.to_object(compose_dict_config(list(overrides)))
    assert isinstance(run_config, RunConfig), type(run_config)
    return run_config


@contextlib.contextmanager
def hydra_errors_as_problems():
    """Hydra's, OmegaConf's and YAML's errors inside -> one ConfigError naming the key or file."""
    import yaml
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        yield
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError([_problem_from_hydra(err)], "Invalid overrides") from None
    except yaml.YAMLError as err:
        raise ConfigError([_problem_from_yaml(err)], "Invalid config file") from None
    except UnicodeDecodeError as err:
        raise ConfigError(_undecodable_files(err), "Invalid config file") from None


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


def compose_dict_config(overrides: list[str], *, with_hydra_node: bool = False):
    """Hydra's public compose of conf/config.yaml with `overrides`: a DictConfig, for this
    package only (`with_hydra_node`: with Hydra's `hydra` node, for its runtime.choices). The
    user config dirs (conf.search_path) are Hydra's search path after conf/. Raises Hydra's
    and OmegaConf's own errors."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name=SCHEMA_NAME, node=RunConfig)
    extra = hydra_searchpath()
    if extra:
        overrides = [f"{SEARCHPATH_KEY}=[{','.join(quote_value(p) for p in extra)}]",
                     *overrides]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=HYDRA_VERSION_BASE):
        return compose(config_name=CONFIG_NAME, overrides=overrides,
                       return_hydra_config=with_hydra_node)


def _problem_from_hydra(err: Exception) -> Problem:
    """One Problem from a Hydra/OmegaConf error, keyed by the config key it names if any, and
    naming the config file it came from (`In 'model/mine'` -> DIR/model/mine.yaml)."""
    keyed = next((e for e in _chain(err) if getattr(e, "full_key", None)), None)
    key = keyed.full_key if keyed is not None else ""
    errors = [e for e in (err, keyed or err.__cause__) if e is not None]
    texts = [" ".join(str(e).split("full_key:")[0].split()) for e in errors if str(e).strip()]
    text = texts[-1] if texts else type(err).__name__
    source = _source_file(str(err))
    if source:
        text = f"{text} (in {source})"
    return Problem(key or "overrides", "", text,
                   "check the keys and values against conf/schema.py")


def _chain(err: BaseException) -> list[BaseException]:
    """`err` and the exceptions it was raised from, outermost first."""
    seen: list[BaseException] = []
    while err is not None and err not in seen:
        seen.append(err)
        err = err.__cause__ or err.__context__
    return seen


def _source_file(message: str) -> str:
    """The config file of `In 'group/option'` in a Hydra message, when a search dir has it."""
    match = re.match(r"In '([\w./-]+)'", message)
    if not match:
        return ""
    group, _, option = match.group(1).rpartition("/")
    source = option_sources(group).get(option) if group else None
    return str(source) if source else ""


def _undecodable_files(err: UnicodeDecodeError) -> list[Problem]:
    """Hydra read a config file that is not UTF-8 text without saying which: find them."""
    problems = []
    for folder in user_config_dirs():
        for path in sorted(folder.rglob("*.yaml")):
            try:
                path.read_text(encoding="utf-8")
            except UnicodeDecodeError as bad:
                problems.append(Problem(str(path), "", f"is not UTF-8 text (byte {bad.start}: "
                                        f"{bad.reason})", "save it as UTF-8 YAML"))
            except OSError:
                continue
    return problems or [Problem("config files", "", f"one is not UTF-8 text: {err.reason}",
                                "save every config file as UTF-8 YAML")]


def _problem_from_yaml(err: Exception) -> Problem:
    """A config file that is not YAML: the file, the line and column, what the parser saw."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = mark.name if mark is not None else "a config file"
    line = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(err, "problem", None) or str(err).splitlines()[0]
    return Problem(where, "", f"is not valid YAML{line}: {what}",
                   "fix the file's YAML syntax (or move it out of the config dir)")
