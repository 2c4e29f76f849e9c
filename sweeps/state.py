"""The sweep dir: sweep.json (the definition), points.json (every point and its attempts), runs/.

    <sweep_dir>/sweep.json      what was swept (the sweep file's fields, plus the command line)
    <sweep_dir>/runner.lock     flock held by the live runner, naming it (sweeps.runner_lock)
    <sweep_dir>/points.json     {"sweep", "runner", "points": [{index, name, values, overrides,
                                 group, tags, run_overrides, run_dir (the latest attempt's),
                                 attempts: [{run_dir, backend, started, job_id, exit_status,
                                 error}]}]}
    <sweep_dir>/runs/<name>-<timestamp>/   each point's run dir (made by launcher.run_dir_writer)
    <sweep_dir>/arrays/                    submitit folders of the Slurm job arrays

A point is known by its overrides: running the same sweep into the same dir again finds its
points (and their run dirs) there, and new points are appended.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time
from pathlib import Path

from conf.errors import ConfigError, Problem
from sweeps.expand import Point
from sweeps.spec_file import SweepDef

POINTS_FILE = "points.json"
SWEEP_FILE = "sweep.json"
RUNS_DIR = "runs"


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S")


class SweepState:
    def __init__(self, sweep_dir: Path, data: dict) -> None:
        self.dir = Path(sweep_dir).resolve()
        self.data = data

    @classmethod
    def load(cls, sweep_dir: Path, *, name: str = "") -> SweepState:
        """The state in `sweep_dir`, or an empty one for a new sweep called `name`."""
        path = Path(sweep_dir) / POINTS_FILE
        if path.is_file():
            return cls(sweep_dir, json.loads(path.read_text()))
        return cls(sweep_dir, {"sweep": name, "created": now(), "runner": None, "points": []})

    @classmethod
    def open(cls, sweep_dir: Path) -> SweepState:
        """An existing sweep dir (for status and retry)."""
        if not (Path(sweep_dir) / POINTS_FILE).is_file():
            raise ConfigError([Problem("sweep_dir", str(sweep_dir), f"holds no {POINTS_FILE}",
                                       "pass a folder made by `meshrun sweep`")],
                              "Not a sweep dir")
        return cls.load(sweep_dir)

    @property
    def exists(self) -> bool:
        return (self.dir / POINTS_FILE).is_file()

    @property
    def runs_dir(self) -> Path:
        return self.dir / RUNS_DIR

    @property
    def records(self) -> list[dict]:
        return self.data["points"]

    def definition(self) -> SweepDef:
        return SweepDef.from_dict(json.loads((self.dir / SWEEP_FILE).read_text())["sweep"])

    def stored_points(self) -> list[Point]:
        return [Point(index=r["index"], overrides=tuple(r["overrides"]), values=r["values"],
                      name=r["name"], group=r["group"], tags=tuple(r["tags"]))
                for r in self.records]

    def merge(self, points: list[Point]) -> list[Point]:
        """Match `points` to stored ones by their overrides; append new ones. Returns the
        points renumbered by their place in points.json."""
        by_overrides = {tuple(r["overrides"]): r for r in self.records}
        out = []
        for point in points:
            record = by_overrides.get(tuple(point.overrides))
            if record is None:
                record = {"index": len(self.records), "attempts": [], "run_dir": None}
                self.records.append(record)
                by_overrides[tuple(point.overrides)] = record
            record.update(name=point.name, values=point.values, overrides=list(point.overrides),
                          group=point.group, tags=list(point.tags),
                          run_overrides=list(point.run_overrides))
            out.append(dataclasses.replace(point, index=record["index"]))
        return out

    def record(self, index: int) -> dict:
        return self.records[index]

    def latest_run_dir(self, index: int) -> Path | None:
        run_dir = self.record(index).get("run_dir")
        return self.dir / run_dir if run_dir else None

    def add_attempt(self, index: int, run_dir: Path, *, backend: str, job_id: str = "") -> None:
        rel = os.path.relpath(run_dir, self.dir)
        record = self.record(index)
        record["attempts"].append({"run_dir": rel, "backend": backend, "started": now(),
                                   "job_id": job_id or None, "exit_status": None, "error": None})
        record["run_dir"] = rel
        self.save()

    def finish_attempt(self, index: int, *, exit_status: int | None = None, error: str = "",
                       job_id: str = "") -> None:
        attempt = self.record(index)["attempts"][-1]
        attempt.update(exit_status=exit_status, finished=now())
        if error:
            attempt["error"] = error
        if job_id:
            attempt["job_id"] = job_id
        self.save()

    def set_runner(self, active: bool) -> None:
        self.data["runner"] = ({"host": socket.gethostname(), "pid": os.getpid(),
                                "started": now()} if active else None)
        self.save()

    def runner(self) -> dict | None:
        """The live runner of this sweep dir (host, pid, started, command), None when no
        process holds its runner.lock (sweeps.runner_lock: a flock, so a dead or recycled pid
        never passes for a live runner)."""
        from sweeps.runner_lock import sweep_runner

        return sweep_runner(self.dir)

    def runner_alive(self) -> bool:
        return self.runner() is not None

    def write_definition(self, sweep: SweepDef) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        record = {"sweep": sweep.to_dict(), "written": now(), "argv": sys.argv}
        _atomic_write(self.dir / SWEEP_FILE, json.dumps(record, indent=2) + "\n")

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data["updated"] = now()
        _atomic_write(self.dir / POINTS_FILE, json.dumps(self.data, indent=2) + "\n")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
