"""Hydra's flags on `meshrun run`: --cfg job, --info, -m/--multirun, the config groups in
--help (read from the files on the search path), and `meshrun completion bash`."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conf.compose import compose_config, config_yaml
from conf.search_path import ENV_VAR
from launcher.cli import main
from tests.support.meshrun_cli import meshrun
from tests.support.user_configs import write_user_configs

REPO = Path(__file__).resolve().parents[2]
GROUPS = ("model", "precision", "parallel", "recompute", "schedule", "optim", "data", "cluster",
          "logging", "experiment")


@pytest.fixture
def user_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, "")  # recorded, so what main() adds to it is undone afterwards
    monkeypatch.setenv("COLUMNS", "200")
    return write_user_configs(tmp_path / "my_conf")


def options_on_disk(*dirs: Path) -> dict[str, list[str]]:
    return {g: sorted({p.stem for d in dirs for p in (d / g).glob("*.yaml")}) for g in GROUPS}


def test_cfg_job_prints_the_composed_config_and_creates_nothing(tmp_path, capsys, user_dir):
    overrides = ["model=tiny", "optim.lr=0.003", f"runs_dir={tmp_path / 'runs'}"]
    assert main(["run", "--cfg", "job", "--resolve", *overrides]) == 0
    assert capsys.readouterr().out == config_yaml(compose_config(overrides))
    assert not (tmp_path / "runs").exists()


def test_info_prints_the_search_path_and_the_groups_found(user_dir, capsys):
    assert main(["run", "--info", "--config-dir", str(user_dir)]) == 0
    out = capsys.readouterr().out
    path_lines = out.split("config groups:")[0]
    assert path_lines.index(str(REPO / "conf")) < path_lines.index(str(user_dir))
    found = dict(re.findall(r"^  \+?(\w+): (.*)$", out.split("config groups:")[1], re.M))
    for group, names in options_on_disk(REPO / "conf", user_dir).items():
        assert [n.split(" (")[0] for n in found[group].split(", ")] == names
    assert f"my1b ({user_dir / 'model' / 'my1b.yaml'})" in found["model"]


def help_groups(text: str) -> dict[str, list[str]]:
    block = text.split("config groups (")[1].split(":\n", 1)[1]
    joined = re.sub(r",\n\s+", ", ", block)
    return {g: v.split(", ") for g, v in re.findall(r"^  \+?(\w+): (.*)$", joined, re.M)}


@pytest.mark.parametrize("with_user_dir", [False, True])
def test_help_lists_every_group_and_option_from_the_files(user_dir, capsys, with_user_dir):
    extra = ["--config-dir", str(user_dir)] if with_user_dir else []
    with pytest.raises(SystemExit) as done:
        main(["run", "--help", *extra])
    assert done.value.code == 0
    dirs = [REPO / "conf"] + ([user_dir] if with_user_dir else [])
    assert help_groups(capsys.readouterr().out) == options_on_disk(*dirs)


def test_multirun_expands_to_the_same_points_as_sweep(user_dir, tmp_path, capsys,
                                                     monkeypatch):
    monkeypatch.setenv("MESHRUN_HOST_MEMORY_BYTES", str(16 * 1024**3))  # MemAvailable moves
    words = ["--config-dir", str(user_dir), "model=my1b", "optim.lr=1e-4,1e-3",
             f"runs_dir={tmp_path / 'runs'}"]
    assert main(["run", "-m", "--dry-run", *words]) == 0
    multirun = capsys.readouterr().out
    assert main(["sweep", "--dry-run", *words]) == 0
    assert multirun == capsys.readouterr().out
    assert "2 points" in multirun and "0.0001" in multirun and "0.001 " in multirun
    assert not (tmp_path / "runs").exists()


def test_several_values_without_m_point_to_m(capsys):
    assert main(["run", "--cfg", "job", "optim.lr=1e-4,1e-3"]) == 2
    assert "meshrun run -m" in capsys.readouterr().err


def test_bash_completion_offers_options_from_the_files(user_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path]),
           ENV_VAR: str(user_dir)}
    script = meshrun("completion", "bash", env=env, timeout=None, check=True).stdout
    (tmp_path / "c.sh").write_text(script)

    def complete(line: str) -> list[str]:
        words = line.split(" ")
        probe = (f'source {tmp_path / "c.sh"}; COMP_LINE="{line}"; COMP_POINT=${{#COMP_LINE}}; '
                 f'COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _meshrun; '
                 'printf "%s\\n" "${COMPREPLY[@]}"')
        out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
        return out.stdout.split()

    assert complete("meshrun ru") == ["run"]
    assert complete("meshrun run model=my") == ["my1b"]
    assert complete("meshrun run +experiment=sm") == ["smoke", "smoke_moe"]
    assert complete("meshrun run --dry") == ["--dry-run"]
