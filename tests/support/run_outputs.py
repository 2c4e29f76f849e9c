"""What a finished or running `meshrun run` left in its runs_dir, read back for tests: the one
run dir, the train losses by step, the run dir whose first train step is logged; and a run dir
written by hand (its spec and metrics rows) for the commands that read finished runs."""
from __future__ import annotations

import json
from pathlib import Path


def only_run_dir(runs_dir: Path) -> Path:
    """The single run dir under `runs_dir` (fails unless there is exactly one)."""
    (run_dir,) = [p for p in runs_dir.iterdir() if p.is_dir()]
    return run_dir


def train_losses(run_dir: Path) -> dict[int, float]:
    """{step: loss} of the train rows in the run's metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "train"}


def training_started(runs: Path) -> Path | None:
    """The run dir under `runs` whose metrics.jsonl holds a train row, or None yet."""
    for metrics in runs.glob("*/metrics.jsonl"):
        if '"kind": "train"' in metrics.read_text() or '"kind":"train"' in metrics.read_text():
            return metrics.parent
    return None


def written_run_dir(root: Path, name: str, spec, rows: list[dict]) -> Path:
    """`root/name` as a run dir: `spec` (a RunSpec) as spec.json and `rows` as metrics.jsonl."""
    from conf.run_dir.spec_io import write_spec

    d = root / name
    d.mkdir()
    write_spec(spec, d / "spec.json")
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d
