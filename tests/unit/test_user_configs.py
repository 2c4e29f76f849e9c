"""A user's own config dirs (outside the package) on Hydra's search path, after conf/:
`--config-dir DIR`, MESHRUN_CONFIG_PATH=DIR1:DIR2 and `hydra.searchpath=[...]` all add
`DIR/model/NAME.yaml` as `model=NAME` and `DIR/experiment/NAME.yaml` as `+experiment=NAME`,
for one run and for a sweep's points alike."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conf.compose import compose_config, compose_many
from conf.errors import ConfigError
from conf.resolve import resolve
from conf.run_dir.paths import ENV_FILE
from conf.search_path import ENV_VAR, config_dirs, group_options
from conf.spec import HostSpec
from launcher.cli import main
from tests.support.user_configs import write_user_configs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "")  # recorded, so what main() adds to it is undone afterwards
    path = write_user_configs(tmp_path / "my_conf")
    assert REPO not in path.parents
    return path


def test_without_user_dirs_only_conf_is_searched(user_dir):
    assert config_dirs() == [REPO / "conf"]
    assert "my1b" not in group_options("model")
    with pytest.raises(ConfigError, match="unknown model option"):
        compose_config(["model=my1b"])


def test_env_var_adds_a_model_and_an_experiment_that_compose_and_validate(user_dir,
                                                                          monkeypatch):
    monkeypatch.setenv(ENV_VAR, f"{user_dir}:{REPO / 'conf'}")
    assert config_dirs() == [REPO / "conf", user_dir]
    assert "my1b" in group_options("model") and "mine" in group_options("experiment")
    cfg = compose_config(["model=my1b", "training.device=cpu", "cluster.procs_per_node=1"])
    assert (cfg.model.name, cfg.model.n_layers, cfg.model.dim) == ("my1b", 3, 64)
    spec = resolve(cfg, host=HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0,
                                        cpu_count=2))
    assert spec.model.n_layers == 3
    exp = compose_config(["+experiment=mine"])
    assert (exp.name, exp.model.name, exp.training.steps) == ("mine", "my1b", 2)


def test_sweeps_see_the_same_search_path(user_dir, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(user_dir))
    points = [["model=my1b", "optim.lr=1e-3"], ["+experiment=mine", "optim.lr=1e-4"]]
    many = compose_many(points)
    assert many == [compose_config(p) for p in points]
    assert [c.model.name for c in many] == ["my1b", "my1b"]


@pytest.mark.parametrize("how", ["flag", "flag=", "searchpath", "env"])
def test_cli_flag_env_and_hydra_searchpath(user_dir, monkeypatch, capsys, how):
    args = {"flag": ["--config-dir", str(user_dir)], "flag=": [f"--config-dir={user_dir}"],
            "searchpath": [f"hydra.searchpath=[file://{user_dir}]"], "env": []}[how]
    if how == "env":
        monkeypatch.setenv(ENV_VAR, str(user_dir))
    assert main(["run", "--cfg", "job", *args, "+experiment=mine"]) == 0
    out = capsys.readouterr().out
    assert "name: mine" in out and "name: my1b" in out and "n_layers: 3" in out


def test_a_missing_config_dir_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ENV_VAR, "")  # recorded, so what main() adds to it is undone afterwards
    assert main(["run", "--cfg", "job", "--config-dir", str(tmp_path / "nope")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_a_file_path_as_option_says_to_use_config_dir(user_dir, capsys):
    assert main(["run", "--cfg", "job", f"model={user_dir}/model/my1b.yaml"]) == 2
    err = capsys.readouterr().err
    assert "is a file path, not an option name" in err and "--config-dir DIR" in err


def test_resume_reuses_the_config_dirs_the_run_was_made_with(user_dir, tmp_path, monkeypatch):
    from launcher.commands import _reuse_config_dirs
    from launcher.run_dir_writer import environment_record

    monkeypatch.setenv(ENV_VAR, str(user_dir))
    record = environment_record()
    monkeypatch.delenv(ENV_VAR)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ENV_FILE).write_text(json.dumps(record))
    _reuse_config_dirs(run_dir)
    assert compose_config(["model=my1b"]).model.n_layers == 3
