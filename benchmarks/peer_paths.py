"""Where the benchmarks find the peer (torchtitan 0.3.0 and a plain hand-written loop, kept
outside this repository and never copied in), on any machine.

- The peer's folder (README.md, setup.sh, run_tt.sh, plain_loop.py, assets/): $MESHRUN_PEER,
  else `shared/peer` beside the repository (REPO/../shared/peer).
- What the peer's setup.sh builds (venv/ with torch and torchtitan, run/ with the corpus):
  $PEER_DIR, the variable setup.sh itself reads, else setup.sh's own default, read from
  setup.sh (so the two never disagree). The peer's Python is venv/bin/python there.

Stdlib only: model_vs_torchtitan.py imports it under the peer's Python too.
"""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PEER_ENV = "MESHRUN_PEER"
PEER_DIR_ENV = "PEER_DIR"
SETUP_DEFAULT = re.compile(r"^PEER_DIR=\$\{PEER_DIR:-([^}]+)\}", re.MULTILINE)
FALLBACK_PEER_DIR = Path(tempfile.gettempdir()) / "meshrun-peer"
"""Used only when setup.sh is absent or says no default (then nothing is set up anyway)."""
PEER_WHERE = f"${PEER_ENV}, else shared/peer beside the repository"
PEER_DIR_WHERE = f"${PEER_DIR_ENV}, else the default in the peer's setup.sh"
"""How each is found, in words, for a benchmark's --help."""


def peer_source() -> Path:
    """The peer's folder: $MESHRUN_PEER, else REPO/../shared/peer."""
    chosen = os.environ.get(PEER_ENV)
    return Path(chosen) if chosen else REPO.parent / "shared" / "peer"


def peer_dir(source: Path | None = None) -> Path:
    """Where the peer's setup.sh puts its venv and run folder: $PEER_DIR, else setup.sh's
    default (read from `source`/setup.sh)."""
    chosen = os.environ.get(PEER_DIR_ENV)
    if chosen:
        return Path(chosen)
    setup = (source or peer_source()) / "setup.sh"
    found = SETUP_DEFAULT.search(setup.read_text()) if setup.is_file() else None
    return Path(os.path.expanduser(found.group(1))) if found else FALLBACK_PEER_DIR


def peer_python(directory: Path | None = None) -> Path:
    """The Python of the peer's venv (torch and torchtitan installed)."""
    return (directory or peer_dir()) / "venv" / "bin" / "python"
