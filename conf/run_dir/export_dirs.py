"""The export folder's publishing rule (torch-free, shared by the ranks and `meshrun resume`).

An export is written into `export.tmp/` beside its final place, fsynced, then renamed to
`export/` (an earlier export is moved to `export.old/` first and deleted after). So `export/`
is complete or absent; `export.tmp/` and `export.old/` are never used.
"""
from __future__ import annotations

from pathlib import Path

from conf.run_dir.paths import EXPORT_DIR, SUMMARY_FILE

EXPORT_WEIGHTS = "model.safetensors"
EXPORT_CONFIG = "config.json"


def export_tmp_dir(export_dir: Path) -> Path:
    return Path(export_dir).with_name(Path(export_dir).name + ".tmp")


def export_replaced_dir(export_dir: Path) -> Path:
    return Path(export_dir).with_name(Path(export_dir).name + ".old")


def is_complete_export(export_dir: Path) -> bool:
    """Published (not .tmp/.old) and holding non-empty weights and config.json (also true of
    a complete export written before exports were atomic)."""
    export_dir = Path(export_dir)
    return all((export_dir / name).is_file() and (export_dir / name).stat().st_size > 0
               for name in (EXPORT_WEIGHTS, EXPORT_CONFIG))


def run_outputs_complete(run_dir: Path, *, export_wanted: bool) -> bool:
    """A finished run's outputs are all there: summary.json and, when it exports, a complete
    export/ (a run killed during its export or summary is not complete: resume redoes them)."""
    run_dir = Path(run_dir)
    if not (run_dir / SUMMARY_FILE).is_file():
        return False
    return not export_wanted or is_complete_export(run_dir / EXPORT_DIR)
