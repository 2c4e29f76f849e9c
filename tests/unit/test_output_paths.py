"""Files a command writes where the user points it, and config files the user brings: each bad
one refused before any work (exit 2, the flag or file named, no traceback), nothing of the
user's overwritten (launcher/output_file.py, conf/compose/single.py)."""
from __future__ import annotations

import pytest

from conf.compose import compose_config
from conf.errors import ConfigError
from conf.search_path import ENV_VAR
from launcher.output_file import check_output_file, write_file_atomically


def _refusal(flag: str, path, **kw) -> str:
    with pytest.raises(ConfigError) as err:
        check_output_file(flag, path, **kw)
    message = str(err.value)
    assert flag in message and str(path) in message and "fix:" in message
    return message


def test_output_file_rules(tmp_path):
    a_file = tmp_path / "a.txt"
    a_file.write_text("mine")
    assert "is a folder" in _refusal("--csv", tmp_path)
    assert "does not exist" in _refusal("--csv", tmp_path / "no" / "x.csv")
    assert "is a file, not a folder" in _refusal("--csv", a_file / "x.csv")
    assert "not written by meshrun" in _refusal("--write-sweep", a_file, keep_unless="# ours")
    assert a_file.read_text() == "mine"
    check_output_file("--csv", a_file)  # a file named as the output is replaced, whole
    check_output_file("--html", tmp_path / "new" / "deeper" / "r.html", make_folder=True)
    assert "is a file" in _refusal("--html", a_file / "sub" / "r.html", make_folder=True)


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.csv"
    target.write_text("old")
    write_file_atomically(target, "new\n")
    assert target.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


def test_write_sweep_keeps_a_file_meshrun_did_not_write(tmp_path, capsys):
    from launcher.cli import main

    mine = tmp_path / "sweep.yaml"
    mine.write_text("name: my hand-written sweep\n")
    args = ["plan", "--search", "model=tiny", "--global-batch-tokens", "4096", "--write-sweep"]
    assert main([*args, str(mine)]) == 2
    err = capsys.readouterr().err
    assert "--write-sweep" in err and "Traceback" not in err
    assert mine.read_text() == "name: my hand-written sweep\n"
    ours = tmp_path / "best.yaml"
    assert main([*args, str(ours)]) == 0
    assert main([*args, str(ours)]) == 0  # its own earlier output is replaced
    assert ours.read_text().startswith("# Written by `meshrun plan --search`")
    assert main([*args, str(tmp_path / "missing" / "x.yaml")]) == 2


def test_compare_refuses_an_output_that_is_a_folder_before_writing(tmp_path, capsys):
    from launcher.cli import main
    from conf.run_dir.spec_io import write_spec
    from tests.support.specs import cpu_spec

    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    write_spec(cpu_spec("model=tiny"), run / "spec.json")
    assert main(["compare", str(run), "--csv", str(tmp_path)]) == 2
    assert main(["compare", str(run), "--json", str(tmp_path / "no" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "--csv" in err and "--json" in err and "Traceback" not in err


@pytest.fixture
def user_conf(tmp_path, monkeypatch):
    (tmp_path / "model").mkdir()
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    return tmp_path / "model"


def _config_error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        compose_config(list(overrides))
    return str(err.value)


def test_config_dir_file_that_is_not_yaml_names_file_line_and_column(user_conf):
    (user_conf / "broken.yaml").write_text("a: [1,\n b")
    message = _config_error("model=broken")
    assert str(user_conf / "broken.yaml") in message and "line 2, column 3" in message


def test_config_dir_file_that_is_not_utf8_is_named(user_conf):
    (user_conf / "latin.yaml").write_bytes(b"\xff\xfe dim: 3")
    assert str(user_conf / "latin.yaml") in _config_error("model=latin")


def test_config_dir_wrong_type_names_the_key_and_the_file(user_conf):
    (user_conf / "mine.yaml").write_text("defaults:\n  - debug\ndim: hello\n")
    message = _config_error("model=mine")
    assert "model.dim" in message and str(user_conf / "mine.yaml") in message
    (user_conf / "typo.yaml").write_text("defaults:\n  - debug\nn_layer: 3\n")
    message = _config_error("model=typo")
    assert "model.n_layer" in message and str(user_conf / "typo.yaml") in message
