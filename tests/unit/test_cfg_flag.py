"""`meshrun run --cfg job|hydra|all [--package PKG] [--resolve]` (launcher/cfg_flag.py,
conf/compose/printed.py) as Hydra prints them, and `hydra.*` overrides refused with meshrun's
equivalent (conf/hydra_keys.py): exit 2, the key, the value, the rule, the fix; nothing made."""
from __future__ import annotations

import pytest
import yaml

from conf.compose import compose_config, config_yaml
from conf.hydra_keys import EQUIVALENTS
from conf.search_path import ENV_VAR
from launcher.cli import main


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "")  # recorded, so what main() adds to it is undone afterwards
    monkeypatch.setenv("COLUMNS", "400")  # one problem per line on stderr


def cfg(capsys, *argv: str) -> str:
    assert main(["run", *argv]) == 0
    return capsys.readouterr().out


def test_job_keeps_interpolations_and_resolve_resolves_them(tmp_path, capsys):
    overrides = ["model=tiny", "optim.lr=0.003", f"runs_dir={tmp_path / 'runs'}"]
    assert "name: ${model.name}\n" in cfg(capsys, "--cfg", "job", *overrides)
    resolved = cfg(capsys, *overrides[:1], "--cfg", "job", "--resolve", *overrides[1:])
    assert resolved == config_yaml(compose_config(overrides))
    assert not (tmp_path / "runs").exists()


def test_package_prints_a_subtree_under_its_header_or_a_value_alone(capsys):
    out = cfg(capsys, "--cfg", "job", "-p", "model", "model=tiny", "model.dim=96")
    head, body = out.split("\n", 1)
    assert head == "# @package model"
    assert yaml.safe_load(body) == yaml.safe_load(config_yaml(compose_config(
        ["model=tiny", "model.dim=96"])))["model"]
    assert cfg(capsys, "--cfg", "job", "--package", "model.dim", "model=tiny") == "64\n"
    assert cfg(capsys, "-c", "job", "--package", "name", "model=tiny") == "tiny\n"


def test_hydra_prints_meshruns_equivalents_under_their_own_name(tmp_path, capsys):
    overrides = ["model=tiny", "cluster=slurm", f"runs_dir={tmp_path}", "name=abc"]
    out = cfg(capsys, "--cfg", "hydra", *overrides)
    assert out.startswith("# meshrun has no Hydra runtime config")
    for e in EQUIVALENTS:
        assert (f"{e.hydra_key} " in out) == bool(e.shown_as), e.hydra_key
    printed = yaml.safe_load(out)
    assert list(printed) == ["meshrun"]  # no invented `hydra:` node, no job config
    section = printed["meshrun"]
    assert section["run_dir"] == f"{tmp_path}/abc-<YYYYmmdd-HHMMSS>"
    assert section["sweep_dir"] == f"{tmp_path}/sweeps/<sweep name>"
    assert section["launcher"] == "slurm" and section["job_name"] == "abc"
    assert section["choices"]["model"] == "tiny" and section["choices"]["cluster"] == "slurm"
    assert section["overrides"] == overrides
    assert cfg(capsys, "--cfg", "hydra", "-p", "meshrun.launcher") == "local\n"


def test_all_is_the_job_config_and_meshruns_section_in_one_document(capsys):
    printed = yaml.safe_load(cfg(capsys, "--cfg", "all", "--resolve", "model=tiny"))
    job = yaml.safe_load(config_yaml(compose_config(["model=tiny"])))
    assert printed == {**job, "meshrun": printed["meshrun"]}
    assert printed["meshrun"]["choices"]["model"] == "tiny"


@pytest.mark.parametrize("argv, wants", [
    (["--cfg", "job", "--package", "model.nope"],
     ["--package=model.nope", "is not a key", "model.dim"]),
    (["--cfg", "hydra", "--package", "hydra.run.dir"],
     ["--package=hydra.run.dir", "no Hydra runtime config", "--package meshrun.run_dir"]),
    (["--resolve", "model=tiny"], ["--resolve", "only works with --cfg", "--cfg job"]),
    (["--package", "model"], ["--package=model", "only works with --cfg"]),
    (["--cfg", "job", "-m", "optim.lr=1e-4,1e-3"], ["--cfg=job", "--multirun", "drop --cfg"]),
    (["--cfg", "all", "--dry-run"], ["--cfg=all", "does not go with --dry-run"]),
])
def test_bad_cfg_flags_exit_2_naming_the_fix(argv, wants, capsys):
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    for want in wants:
        assert want in err, err


@pytest.mark.parametrize("override, fix", [
    ("hydra.run.dir=/data/out/exp1", "runs_dir=/data/out name=exp1"),
    ("hydra.run.dir=outputs/${now:%H}", "runs_dir=DIR name=NAME"),
    ("hydra.sweep.dir=/data/sweeps/s1", "meshrun sweep --dir /data/sweeps/s1"),
    ("hydra.sweep.subdir=x", "meshrun sweep --run-name TEMPLATE"),
    ("hydra/launcher=submitit_slurm", "cluster=slurm"),
    ("hydra/launcher=basic", "cluster=local|nodes|slurm"),
    ("hydra.launcher.timeout_min=30", "cluster.time_limit_min (with cluster=slurm)"),
    ("hydra.launcher.partition=gpu", "cluster.partition"),
    ("hydra.job.name=abc", "name=NAME"),
    ("+hydra.verbose=true", "no meshrun equivalent: remove it"),
    ("hydra.run.dir=a,b", "runs_dir=DIR name=NAME"),
])
def test_hydra_overrides_are_refused_with_meshruns_equivalent(override, fix, tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["run", "--dry-run", override, f"runs_dir={runs}"]) == 2
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if "hydra" in x.split(":")[0])
    key, value = override.lstrip("+").split("=", 1) if "=" in override else (override, "")
    assert line.startswith(f"  {key}={value}: ") and "no Hydra runtime config" in line, err
    assert f"(fix: {fix}" in line and "meshrun run --cfg hydra" in line, err
    assert "Traceback" not in err and not runs.exists()


def test_every_hydra_override_is_named_in_one_message(capsys):
    assert main(["run", "--cfg", "job", "hydra.run.dir=/a/b", "hydra/launcher=submitit_slurm",
                 "model=nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Invalid overrides (3 problems):")
    assert "hydra.run.dir=/a/b" in err and "hydra/launcher=submitit_slurm" in err
