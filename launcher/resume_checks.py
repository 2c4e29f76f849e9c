"""What `meshrun resume` checks before launch, torch-free: the run dir's own files can be read,
and the new leg keeps the layout and sequence length its newest checkpoint was saved with
(an exact resume reads per-rank files; another layout is a new run with checkpoint.load_from)."""
from __future__ import annotations

import json
from pathlib import Path

from conf.run_dir.checkpoint_dirs import META_FILENAME
from conf.errors import ProblemList
from conf.run_dir.paths import OVERRIDES_FILE, SPEC_FILE, RunDir
from conf.spec import RunSpec
from parallel.dims import ParallelDims

TITLE = "Cannot resume"


def _read_json(path: Path, problems: ProblemList) -> object | None:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        problems.add(str(path), "", f"cannot be read as JSON ({type(err).__name__}: "
                     f"{str(err)[:120]})", "restore the file (or start a new run with "
                     "checkpoint.load_from=<this run dir>)")
        return None


def check_resume_files(run_dir: Path) -> None:
    """overrides.json is a list of strings and spec.json a JSON object; else one ConfigError."""
    rd, problems = RunDir(run_dir), ProblemList()
    overrides = _read_json(rd.overrides_file, problems)
    if overrides is not None and not (isinstance(overrides, list)
                                      and all(isinstance(o, str) for o in overrides)):
        problems.add(str(rd.overrides_file), "", f"must be a JSON list of override strings "
                     f"(holds {type(overrides).__name__})", f"restore {OVERRIDES_FILE}, e.g. "
                     '["model=tiny", "training.steps=100"]')
    spec = _read_json(rd.spec_file, problems)
    if spec is not None and not isinstance(spec, dict):
        problems.add(str(rd.spec_file), "", f"must be a JSON object (holds "
                     f"{type(spec).__name__})", f"restore {SPEC_FILE}")
    problems.raise_if_any(TITLE)


def checkpoint_meta_or_problem(checkpoint: Path, problems: ProblemList) -> dict:
    """The checkpoint's meta.json, or {} with a problem naming the file."""
    path = checkpoint / META_FILENAME
    meta = _read_json(path, problems)
    if meta is None:
        return {}
    if not isinstance(meta, dict) or not isinstance(meta.get("world_size"), int):
        problems.add(str(path), "", "must be a JSON object with an integer world_size",
                     "restore it, or resume from an older checkpoint (delete this step_N folder)")
        return {}
    return meta


def saved_degrees(meta: dict) -> dict:
    """The layout a checkpoint was saved with (what training.loop.save writes)."""
    layout = (meta.get("metadata") or {}).get("layout") if isinstance(meta.get("metadata"),
                                                                      dict) else None
    return dict(layout) if isinstance(layout, dict) else {"world_size": meta["world_size"]}


def check_same_layout(run_dir: Path, latest: Path, meta: dict, spec: RunSpec,
                      problems: ProblemList) -> None:
    """World size, parallel degrees and training.seq_len match the newest checkpoint's run."""
    saved = saved_degrees(meta)
    now = ParallelDims.from_spec(spec.parallel).checkpoint_degrees()
    new_run = f"start a new run with checkpoint.load_from={latest} (DCP reshards it)"
    if saved["world_size"] != now["world_size"]:
        problems.add("cluster.procs_per_node", spec.cluster.procs_per_node,
                     f"world size {now['world_size']} differs from the checkpoint's "
                     f"{saved['world_size']} ({latest.name}); a run resumes only under its own "
                     "layout", f"resume with world size {saved['world_size']}, or {new_run}")
    else:
        differ = [k for k in now if k in saved and saved[k] != now[k]]
        if differ:
            problems.add(f"parallel ({spec.parallel.name})",
                         ", ".join(f"{k}={now[k]}" for k in differ),
                         f"the checkpoint {latest.name} was saved with "
                         f"{', '.join(f'{k}={saved[k]}' for k in differ)}; a run resumes "
                         "only under its own layout", f"resume with that layout, or {new_run}")
    old_seq = _stored_seq_len(run_dir)
    if old_seq is not None and old_seq != spec.training.seq_len:
        problems.add("training.seq_len", spec.training.seq_len,
                     f"the run was trained with training.seq_len={old_seq}; its data position "
                     "counts samples of that length", f"resume with training.seq_len={old_seq}, "
                     f"or {new_run}")


def _stored_seq_len(run_dir: Path) -> int | None:
    try:
        value = json.loads(RunDir(run_dir).spec_file.read_text())["training"]["seq_len"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) else None


__all__ = ["check_resume_files", "check_same_layout",
           "checkpoint_meta_or_problem", "saved_degrees"]
