"""Rules on checkpointing and on the run dir or checkpoint a run resumes from or loads."""
from __future__ import annotations

from pathlib import Path

from conf.errors import ProblemList
from conf.hf_model_config import is_hf_model_dir
from conf.run_dir.paths import CHECKPOINTS_DIR, RunDir, find_checkpoint
from conf.run_dir.checkpoint_dirs import DCP_METADATA_FILENAME, META_FILENAME, checkpoint_step
from conf.run_dir.checkpoint_verify import prelaunch_problem
from conf.schema import CheckpointConfig


def check_checkpoint(c: CheckpointConfig, problems: ProblemList, *, check_paths: bool) -> None:
    if c.every_steps < 0:
        problems.add("checkpoint.every_steps", c.every_steps, "must be >= 0 (0 = only at the end)",
                     "give a value >= 0")
    if c.keep_last < 1:
        problems.add("checkpoint.keep_last", c.keep_last, "must be >= 1", "keep at least 1")
    if c.resume_from and check_paths:
        run_dir = Path(c.resume_from).expanduser()
        if not RunDir(run_dir).is_run_dir:
            problems.add("checkpoint.resume_from", c.resume_from,
                         "is not a meshrun run dir (no spec.json there)",
                         "pass a folder made by `meshrun run`, e.g. runs/<name>-<timestamp>")
    if c.load_from and check_paths and is_hf_model_dir(c.load_from):
        return  # a Hugging Face model folder: weights only, checked against the model in resolve
    if c.load_from and check_paths and find_checkpoint(Path(c.load_from).expanduser()) is None:
        problems.add("checkpoint.load_from", c.load_from,
                     f"{_why_not_a_checkpoint(Path(c.load_from).expanduser())}; a checkpoint "
                     f"is a step_N folder with {META_FILENAME} and DCP's "
                     f"{DCP_METADATA_FILENAME}, or a run dir with {CHECKPOINTS_DIR}/step_N",
                     "pass a run dir or one of its complete step_N folders")
    elif c.load_from and check_paths:
        damaged = prelaunch_problem(Path(c.load_from).expanduser())
        if damaged:
            problems.add("checkpoint.load_from", c.load_from, damaged,
                         "pass an intact checkpoint (or a run dir holding one)")


def _why_not_a_checkpoint(path: Path) -> str:
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is a file, not a folder"
    if checkpoint_step(path) is not None:
        missing = [n for n in (META_FILENAME, DCP_METADATA_FILENAME) if not (path / n).is_file()]
        return f"is a step_N folder without {' and '.join(missing)} (an interrupted save?)"
    if (path / CHECKPOINTS_DIR).is_dir():
        return f"holds no complete checkpoint under {CHECKPOINTS_DIR}/"
    return f"is neither a step_N folder nor a run dir with {CHECKPOINTS_DIR}/"
