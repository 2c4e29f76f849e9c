"""The launch interface (launcher/backends/interface.py): one backend per cluster kind, picked
in one place (launcher/backends/choose.py), which is the only code in launcher/ and sweeps/
that compares the cluster kind; each backend renders, launches, reports and stops a run."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conf.errors import ConfigError
from conf.run_dir.paths import RunDir
from launcher.backends.choose import BACKENDS, backend_for, backend_of_run_dir
from launcher.backends.interface import LaunchBackend
from launcher.backends.local_torchrun import LocalBackend
from launcher.backends.nodes_torchrun import NodesBackend, node_torchrun_command
from launcher.backends.slurm_backend import SlurmBackend
from launcher.backends.slurm_submit import record_job
from tests.support.specs import cpu_spec

REPO = Path(__file__).resolve().parents[2]
KINDS = ("local", "slurm", "nodes")
SMALL = ("model=tiny", "data=synthetic", "cluster.procs_per_node=2", "cluster.gpus_per_node=0")


def spec_on(kind: str):
    extra = {"local": [], "slurm": ["cluster=slurm"],
             "nodes": ["cluster=nodes", "cluster.rdzv_host=10.0.0.1"]}[kind]
    return cpu_spec(*SMALL, *extra)


@pytest.mark.parametrize("kind, backend", [("local", LocalBackend), ("slurm", SlurmBackend),
                                           ("nodes", NodesBackend)])
def test_each_cluster_kind_has_one_backend(kind, backend):
    chosen = backend_for(spec_on(kind).cluster)
    assert type(chosen) is backend and isinstance(chosen, LaunchBackend)
    assert chosen.kind == kind
    assert {k.value for k in BACKENDS} == set(KINDS)


def _kind_comparisons(path: Path) -> list[str]:
    """Comparisons (==, !=, in) of anything with a cluster kind's name, or of `.kind` with a
    string: the branches the launch interface replaced."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        parts = [node.left, *node.comparators]
        strings = {p.value for p in parts if isinstance(p, ast.Constant)}
        members = {p.attr for p in parts if isinstance(p, ast.Attribute)
                   and isinstance(p.value, ast.Name) and p.value.id == "ClusterKind"}
        kind_side = any(isinstance(p, ast.Attribute) and p.attr == "kind" for p in parts)
        if (strings | members) & set(KINDS) or (kind_side and "cluster" in ast.unparse(node)):
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_but_the_chooser_branches_on_the_cluster_kind():
    paths = [p for package in ("launcher", "sweeps") for p in (REPO / package).rglob("*.py")
             if p != REPO / "launcher" / "backends" / "choose.py"]
    assert len(paths) > 40
    assert [hit for p in paths for hit in _kind_comparisons(p)] == []


def test_the_dry_run_rendering_comes_from_the_backend(tmp_path):
    run_dir = tmp_path / "run-1"
    local = backend_for(spec_on("local").cluster)
    (command,) = local.rank_commands(spec_on("local"), str(run_dir))
    assert command[-1] == str(run_dir) and "--standalone" in command
    nodes = backend_for(spec_on("nodes").cluster).rank_commands(spec_on("nodes"), str(run_dir))
    assert [c[1:] for c in nodes] == [["-m", "launcher.node_agent", str(run_dir),
                                        f"--node-rank={k}"] for k in (0, 1)]
    leg = node_torchrun_command(spec_on("nodes"), str(run_dir), node=1, leg=2)
    assert {"--node_rank=1", "--rdzv_id=run-1-leg2", "--rdzv_endpoint=10.0.0.1:29500"} <= set(leg)
    assert backend_for(spec_on("slurm").cluster).rank_commands(spec_on("slurm"), "x") is None


def _run_dir(tmp_path: Path, kind: str) -> Path:
    run_dir = tmp_path / kind
    run_dir.mkdir()
    RunDir(run_dir).write_spec(spec_on(kind))
    return run_dir


def test_a_run_dirs_backend_comes_from_its_spec(tmp_path):
    for kind in KINDS:
        assert backend_of_run_dir(_run_dir(tmp_path, kind)).kind == kind
    stub = tmp_path / "stub"
    stub.mkdir()
    RunDir(stub).spec_file.write_text("{}")
    assert backend_of_run_dir(stub) is None


def test_slurm_state_is_the_newest_jobs_and_nothing_before_one(tmp_path):
    from launcher.backends.slurm_state import JobState

    run_dir = _run_dir(tmp_path, "slurm")
    assert SlurmBackend().state(run_dir) == {}
    record_job(run_dir, {"job_id": "7"})
    record_job(run_dir, {"job_id": "8"})
    known = {"8": JobState(job_id="8", state="RUNNING", exit_code="", elapsed="00:01:00",
                           nodes="n1")}
    state = SlurmBackend().state(run_dir, scheduler=known)
    assert (state["job_id"], str(state["state"]), state["scheduler_state"],
            state["submissions"]) == ("8", "running", "RUNNING", 2)


def test_slurm_stop_cancels_the_newest_job(tmp_path, monkeypatch):
    run_dir = _run_dir(tmp_path, "slurm")
    with pytest.raises(ConfigError, match="has no Slurm job"):
        SlurmBackend().stop(run_dir)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/scancelled\n")
    (bin_dir / "scancel").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    record_job(run_dir, {"job_id": "41"})
    record_job(run_dir, {"job_id": "42"})
    assert "42" in SlurmBackend().stop(run_dir)
    assert (tmp_path / "scancelled").read_text().split() == ["42"]


HOLDER = """
import signal, sys, time
from pathlib import Path
from launcher.backends.run_lock import acquire_run_lock
signal.signal(signal.SIGTERM, lambda *_: sys.exit(17))
with acquire_run_lock(Path(sys.argv[1]), action="run"):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_local_stop_signals_the_launcher_that_holds_the_run_dir(tmp_path):
    run_dir = _run_dir(tmp_path, "local")
    with pytest.raises(ConfigError, match="is not running"):
        LocalBackend().stop(run_dir)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        said = LocalBackend().stop(run_dir)
        assert f"pid {holder.pid}" in said
        assert holder.wait(timeout=30) == 17
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    with pytest.raises(ConfigError, match="is not running"):
        LocalBackend().stop(run_dir)
