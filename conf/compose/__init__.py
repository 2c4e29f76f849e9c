"""Hydra in one room: the only package of meshrun that imports hydra or omegaconf.

Composing (conf/config.yaml + groups + overrides, against conf/schema.py):

- `compose_config(overrides) -> RunConfig`: one run; raises ConfigError listing every bad
  override (checked before Hydra, which stops at the first) or Hydra's own complaint.
- `compose_many(override_lists, *, settings=None, stats=None) -> [RunConfig | ConfigError]`:
  many runs (a sweep's points), sharing Hydra work; per list exactly what compose_config
  returns or raises.
- `check_overrides(overrides)`: only the checks compose_config runs before Hydra.
- `config_yaml(run_config) -> str`: the composed config as YAML (the run dir's config.yaml).

Override grammar (Hydra's parser; results are plain Python data, never Hydra objects):

- `parse_override(line) -> ParsedOverride` (raises OverrideSyntaxError) and
  `try_parse_override(line) -> (ParsedOverride | None, syntax error text)`;
  a sweep's values are in `ParsedOverride.sweep: SweepValues` (choice/range/glob/interval).
- `split_sweeps(lines) -> (single-value lines, sweep lines)`.
- `display_value(key, value_text) -> str`: a value as tables, run names and tags show it.
- `quote_value(text) -> str`: a string as an override value that parses back to itself.

`DictConfig` never leaves this package. tests/unit/test_hydra_in_one_room.py enforces that no
other module imports hydra or omegaconf.
"""
from conf.compose.many import compose_many
from conf.compose.parse import (OverrideSyntaxError, ParsedOverride, SweepValues, display_value,
                                parse_override, quote_value, split_sweeps, try_parse_override)
from conf.compose.single import check_overrides, compose_config, config_yaml

__all__ = [
    "OverrideSyntaxError", "ParsedOverride", "SweepValues", "check_overrides", "compose_config",
    "compose_many", "config_yaml", "display_value", "parse_override", "quote_value",
    "split_sweeps", "try_parse_override",
]
