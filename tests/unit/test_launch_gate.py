"""The launch gate (launcher/launch_gate.py): a run whose plan does not fit is refused before
anything is written unless --force; on CPU the verdict sums the node's ranks against the
host's available memory (parallel.cost.fit); W&B online needs a key before the queue."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from conf.compose import compose_config
from conf.errors import ConfigError, ProblemList
from conf.resolve import resolve
from conf.spec import HostSpec
from launcher.hardware import probe_host
from launcher.launch_gate import add_wandb_problem, check_launchable
from launcher.wandb_credentials import credentials_source
from parallel.cost.devices import GIB
from parallel.cost.fit import CPU_RANK_RUNTIME_BYTES, USABLE_FRACTION, node_peak_bytes
from parallel.cost.memory import estimate_memory
from parallel.cost.plan import make_plan
from tests.support.meshrun_cli import REPO, meshrun

PP2 = ["model=tiny", "logging=disabled", "cluster.procs_per_node=4", "parallel.pp=2",
       "parallel.dp_shard=2", "parallel.zero=3", "training.seq_len=64", "training.micro_batch_size=4"]


def _spec(*overrides: str, mem: int):
    host = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=2,
                    mem_available_bytes=mem)
    return resolve(compose_config(list(overrides)), host=host, check_paths=False)


def test_cpu_verdict_sums_every_local_rank_against_available_memory():
    spec = _spec(*PP2, mem=8 * GIB)
    peaks = [estimate_memory(spec, rank=r).total for r in range(4)]
    assert len(set(peaks)) > 1  # the stages differ: a sum, not 4 x the fullest
    assert node_peak_bytes(spec) == sum(peaks)
    need = sum(peaks) + 4 * CPU_RANK_RUNTIME_BYTES
    v = make_plan(spec).verdict
    assert v.need_bytes == need and v.fits is True and v.ranks == 4
    assert v.usable_bytes == USABLE_FRACTION * 8 * GIB
    # the edge: exactly enough fits, one byte less does not
    exact = need / USABLE_FRACTION
    assert make_plan(_spec(*PP2, mem=int(exact) + 1)).verdict.fits is True
    assert make_plan(_spec(*PP2, mem=int(exact) - 1)).verdict.fits is False


def test_no_cpu_verdict_where_the_memory_is_unknown():
    assert make_plan(_spec("model=tiny", mem=0)).verdict.fits is None
    slurm = _spec("model=tiny", "cluster=slurm", "cluster.gpus_per_node=0",
                  "cluster.procs_per_node=2", mem=64 * GIB)
    assert make_plan(slurm).verdict.fits is None  # a node's RAM, not this machine's


def test_the_default_run_fits_this_machine():
    """`meshrun run` with no arguments must launch: its plan fits with a wide margin."""
    spec = resolve(compose_config([]), host=probe_host(), check_paths=False)
    v = make_plan(spec).verdict
    assert v.fits is True, v.line
    assert v.need_bytes < 0.2 * v.usable_bytes, v.line


def test_refused_in_process_with_suggestions_unless_forced():
    spec = _spec("model=llama3_8b", "logging=disabled", mem=24 * GIB)
    with pytest.raises(ConfigError) as err:
        check_launchable(spec, ["model=llama3_8b"], force=False)
    (problem,) = err.value.problems
    assert problem.key == "memory" and "the plan does not fit" in problem.rule
    assert "parallel.tp=2" in problem.fix and "--force" in problem.fix
    check_launchable(spec, ["model=llama3_8b"], force=True)  # forced: no problem left


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """No W&B key anywhere: a fresh HOME, no WANDB_* variables, no NETRC."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "NETRC"}
    return {**env, "HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO), **extra}


def test_run_that_does_not_fit_exits_2_writes_nothing_and_force_passes(tmp_path):
    runs = tmp_path / "runs"
    refused = meshrun("run", "model=llama3_8b", f"runs_dir={runs}", env=_env(tmp_path),
                      timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stderr
    assert "Cannot launch" in refused.stderr and "the plan does not fit" in refused.stderr
    assert "parallel.tp=2" in refused.stderr and "--force" in refused.stderr
    assert not runs.exists()
    forced = meshrun("run", "--force", "--prepare-only", "model=llama3_8b", f"runs_dir={runs}",
                     env=_env(tmp_path), timeout=120)
    assert forced.returncode == 0, forced.stderr
    assert Path(forced.stdout.strip()).is_dir()  # past the gate (prepared, not launched)


def test_force_says_what_it_does_in_help():
    from launcher.cli import build_parser

    run = build_parser()._subparsers._group_actions[0].choices["run"]
    helped = " ".join(run.format_help().split())
    assert "--force" in helped and "you accept that it may fail out of memory" in helped


def test_plan_says_plainly_that_the_model_does_not_fit_this_machine():
    from io import StringIO

    from rich.console import Console

    from launcher import commands

    out = StringIO()
    assert commands.plan(["model=llama3_70b"], console=Console(file=out, width=200)) == 0
    text = out.getvalue()
    assert "model llama3_70b does not fit this machine's memory" in text
    assert "0 tokens/s" not in text and "none: the run does not fit" in text


def test_sweep_refuses_before_any_point_unless_forced(tmp_path):
    runs = tmp_path / "runs"
    args = ["sweep", f"runs_dir={runs}", "model=debug,llama3_8b", "--dry-run"]
    refused = meshrun(*args, env=_env(tmp_path), timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "Cannot sweep" in refused.stderr and "point 1 [model=llama3_8b]" in refused.stderr
    assert "point 0" not in refused.stderr and "--force" in refused.stderr
    assert not runs.exists()
    assert meshrun(*args, "--force", env=_env(tmp_path), timeout=120).returncode == 0


def test_wandb_online_without_a_key_is_refused_at_the_dry_run(tmp_path):
    args = ["run", "--dry-run", "logging=online", f"runs_dir={tmp_path / 'runs'}"]
    refused = meshrun(*args, env=_env(tmp_path), timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "logging.wandb_mode=online" in refused.stderr and "wandb login" in refused.stderr
    assert "logging=offline" in refused.stderr and "Traceback" not in refused.stderr


@pytest.fixture(scope="module")
def online_spec():
    return _spec("model=tiny", "logging=online", mem=8 * GIB)


@pytest.mark.parametrize("where", ["env", "netrc", "settings", "nowhere", "other host"])
def test_wandb_key_is_found_where_wandb_looks(where, online_spec, tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("WANDB_")] + ["NETRC"]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    if where == "env":
        monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    if where in ("netrc", "other host"):
        (tmp_path / ".netrc").write_text("machine api.wandb.ai login user password secret\n")
    if where == "other host":
        monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.com")
    if where == "settings":
        (tmp_path / ".config" / "wandb").mkdir(parents=True)
        (tmp_path / ".config" / "wandb" / "settings").write_text("[default]\napi_key = s\n")
    found = credentials_source()
    assert (found is None) == (where in ("nowhere", "other host")), found
    problems = ProblemList()
    add_wandb_problem(online_spec, problems)
    assert bool(problems) == (found is None)


def test_host_memory_from_the_os_or_the_environment(monkeypatch):
    from launcher.host_memory import HOST_MEMORY_ENV, available_bytes

    monkeypatch.delenv(HOST_MEMORY_ENV, raising=False)
    meminfo = {line.split(":")[0]: int(line.split()[1]) * 1024
               for line in Path("/proc/meminfo").read_text().splitlines()}
    assert 0 < available_bytes() <= meminfo["MemTotal"]
    monkeypatch.setenv(HOST_MEMORY_ENV, str(3 * GIB))
    assert probe_host().mem_available_bytes == 3 * GIB
    monkeypatch.setenv(HOST_MEMORY_ENV, "3GiB")
    with pytest.raises(ConfigError, match=HOST_MEMORY_ENV):
        available_bytes()
