"""The TensorBoard and MLflow knobs (logging.tensorboard, logging.mlflow*): a bad value is
refused before launch, naming key, value, rule and fix (exit 2 from the CLI, no traceback);
good values resolve; a logger whose package is missing is refused by the launch gate."""
from __future__ import annotations

import pytest

from conf.errors import ConfigError, ProblemList
from launcher.launch_gate import add_logger_package_problems
from tests.support.meshrun_cli import meshrun
from tests.support.specs import cpu_spec

REFUSED = [
    ("logging.mlflow=true|logging.mlflow_tracking_uri=localhost:5000",
     ("logging.mlflow_tracking_uri=localhost:5000", "not a URI", "http://localhost:5000")),
    ("logging.mlflow=true|logging.mlflow_tracking_uri=file:///tmp/mlruns",
     ("logging.mlflow_tracking_uri=file:///tmp/mlruns", "refuses file stores", "sqlite:////")),
    ("logging.mlflow=true|logging.mlflow_tracking_uri=sqlite:///rel.db",
     ("sqlite:///rel.db", "not an absolute SQLite path", "four slashes")),
    ("logging.mlflow=true|logging.mlflow_tracking_uri=htp://host:5000",
     ("htp://host:5000", "scheme 'htp'", "http")),
    ("logging.mlflow_tracking_uri=http://host:5000",
     ("logging.mlflow_tracking_uri=http://host:5000", "logging.mlflow=false",
      "add logging.mlflow=true")),
    ("logging.mlflow=true|logging.mlflow_experiment=' '",
     ("logging.mlflow_experiment=' '", "must name an experiment", "meshrun")),
]


@pytest.mark.parametrize("overrides,expect", REFUSED, ids=[o for o, _ in REFUSED])
def test_bad_tracker_knob_is_refused_with_key_rule_and_fix(overrides, expect):
    with pytest.raises(ConfigError) as refused:
        cpu_spec(*overrides.split("|"))
    message = str(refused.value)
    assert len(refused.value.problems) == 1, message
    for text in expect:
        assert text in message, message


@pytest.mark.parametrize("uri", ["", "http://127.0.0.1:5000", "https://mlflow.example.com",
                                 "sqlite:////abs/mlflow.db", "postgresql+psycopg2://u@h/db",
                                 "databricks"])
def test_good_tracking_uris_resolve(uri):
    spec = cpu_spec("logging.mlflow=true", f"logging.mlflow_tracking_uri={uri}",
                    "logging.tensorboard=true")
    assert spec.logging.mlflow_tracking_uri == uri and spec.logging.tensorboard


def test_missing_logger_package_is_refused_by_the_launch_gate():
    spec = cpu_spec("logging.mlflow=true")
    problems = ProblemList()
    add_logger_package_problems(spec, problems, packages={
        "mlflow": ("no_such_package_meshrun", "pip install no-such"), "tensorboard":
        ("tensorboard", "pip install tensorboard")})
    [problem] = problems.items  # tensorboard is off: not asked for
    assert problem.key == "logging.mlflow" and "not installed" in problem.rule
    assert problem.fix == "pip install no-such, or logging.mlflow=false"
    present = ProblemList()
    add_logger_package_problems(spec, present)  # mlflow is installed here (the test extra)
    assert not present


def test_cli_refuses_a_bad_tracking_uri_with_exit_2_before_anything_runs(tmp_path):
    result = meshrun("run", "model=tiny", "logging.mlflow=true",
                     "logging.mlflow_tracking_uri=localhost:5000", f"runs_dir={tmp_path}",
                     timeout=120)
    assert result.returncode == 2, result.stderr
    assert "logging.mlflow_tracking_uri=localhost:5000: is not a URI" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert list(tmp_path.iterdir()) == []
