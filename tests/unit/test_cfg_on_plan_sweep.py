"""`meshrun plan` and `meshrun sweep` take Hydra's --cfg job|hydra|all, --package and
--resolve as `meshrun run` does (launcher/cfg_flag.py): plan prints the run's config; sweep
prints every point's, one YAML document each, headed by the point; nothing is planned,
validated or written. Misused, they exit 2 naming the fix."""
from __future__ import annotations

import pytest
import yaml

from conf.search_path import ENV_VAR
from launcher.cli import main


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "")  # recorded, so what main() adds to it is undone afterwards
    monkeypatch.setenv("COLUMNS", "400")


def out(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_plan_prints_what_run_prints(capsys):
    argv = ("--cfg", "all", "--resolve", "-p", "model", "model=tiny", "model.dim=96")
    printed = out(capsys, "plan", *argv)
    assert printed == out(capsys, "run", *argv) and "dim: 96\n" in printed


def test_sweep_prints_one_document_per_point(tmp_path, capsys):
    printed = out(capsys, "sweep", "--cfg", "job", "--resolve", "model=tiny",
                  "optim.lr=1e-4,1e-3", f"runs_dir={tmp_path}", "--run-name", "lr{optim.lr}")
    documents = printed.split("---\n")
    assert [d.splitlines()[0] for d in documents] == [
        "# point 0 (run lr0.0001): optim.lr=0.0001", "# point 1 (run lr0.001): optim.lr=0.001"]
    configs = [yaml.safe_load(d) for d in documents]
    assert [c["optim"]["lr"] for c in configs] == [1e-4, 1e-3]
    assert [c["name"] for c in configs] == ["lr0.0001", "lr0.001"]
    assert out(capsys, "sweep", "-c", "job", "-p", "optim.lr", "optim.lr=1e-4,1e-3") == (
        "# point 0 (run lr=0.0001): optim.lr=0.0001\n0.0001\n---\n"
        "# point 1 (run lr=0.001): optim.lr=0.001\n0.001\n")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv, wants", [
    (["plan", "--cfg", "job", "--search"], ["--cfg=job", "does not go with --search"]),
    (["plan", "--package", "model"], ["--package=model", "only works with --cfg",
                                      "meshrun plan --cfg job --package model"]),
    (["sweep", "--resolve", "optim.lr=1e-4,1e-3"], ["meshrun sweep --cfg job --resolve"]),
    (["sweep", "--cfg", "job", "--dry-run", "optim.lr=1e-4,1e-3"],
     ["does not go with --dry-run"]),
    (["sweep", "status", "somewhere", "--cfg", "job"], ["does not go with sweep status"]),
])
def test_misused_flags_exit_2_naming_the_fix(argv, wants, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in wants) and "Traceback" not in err, err
