"""A user config folder outside the repository (what --config-dir / MESHRUN_CONFIG_PATH add)."""
from __future__ import annotations

import textwrap
from pathlib import Path


def write_user_configs(root: Path) -> Path:
    """A user config dir: a model built on the shipped `tiny`, and an experiment using it."""
    (root / "model").mkdir(parents=True)
    (root / "experiment").mkdir()
    (root / "model" / "my1b.yaml").write_text(textwrap.dedent("""\
        defaults:
          - tiny
          - _self_
        name: my1b
        n_layers: 3
        """))
    (root / "experiment" / "mine.yaml").write_text(textwrap.dedent("""\
        # @package _global_
        defaults:
          - override /model: my1b
        name: mine
        training:
          steps: 2
          seq_len: 32
          micro_batch_size: 2
        """))
    return root
