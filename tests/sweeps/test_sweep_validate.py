"""Validation of every point (the fast compose path equals `compose_config`, the messages equal
a single run's), the cost preview, Slurm array grouping and the sweep dir's point identity."""
from __future__ import annotations

import sys

import pytest
from rich.console import Console

from conf.compose import compose_config, compose_many
from conf.errors import ConfigError
from conf.resolve import resolve
from conf.spec import HostSpec
from sweeps.expand import expand
from sweeps.preview import preview_table
from sweeps.spec_file import SweepDef, inline_sweep
from sweeps.state import SweepState
from sweeps.validate import InvalidSweep, validate

CPU = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=8)
CASES = [
    ["model=tiny", "optim.lr=1e-4", "training.steps=10", "name='x y'"],
    ["model=tiny", "model.name=foo"],  # an interpolation reads model.name (name: ${model.name})
    ["model=tiny", "precision=bf16", "precision.name=fp32", "training.device=cpu"],
    ["+experiment=smoke", "training.steps=7", "logging.wandb_tags=[a,'b c']"],
    ["~model", "optim.lr=1"],
    ["cluster=slurm", "cluster.env.NCCL_DEBUG=INFO", "+cluster.env.FOO=bar",
     "cluster.extra_sbatch=['--x=1',--y]"],
    ["model=tiny", "name=1e-4", "logging.wandb_project=3", "training.cpu_peak_flops=5",
     "schedule.kind=wsd", "training.compile=true", "schedule.decay_shape=cosine"],
    ["model=tiny", "training.steps=abc", "trainng.seed=1"],
    ["model=llama4"],
    ["training.steps=${nope}"],
    ["model=tiny", "name=${model.n_layers}"],
    ["+experiment=smoke", "model=debug"],
    ["model=tiny", "++training.steps=3"],
]


def _outcome(compose, overrides):
    try:
        return compose(overrides)
    except ConfigError as err:
        return f"{type(err).__name__}: {err}"


def _shown(result):
    return f"{type(result).__name__}: {result}" if isinstance(result, ConfigError) else result


def test_compose_many_equals_compose_config_results_and_errors():
    stats: dict[str, int] = {}
    many = compose_many(CASES * 2, stats=stats)  # the second round is served from the caches
    assert [_shown(r) for r in many] == [_outcome(compose_config, o) for o in CASES * 2]
    assert stats["fast"] > 0 and stats["merged"] > 0


def test_without_hydras_private_hook_compose_many_composes_the_public_way(monkeypatch):
    compose_config([])  # Hydra itself has loaded its internals; now hide them from meshrun
    monkeypatch.setitem(sys.modules, "hydra._internal.config_loader_impl", None)
    stats: dict[str, int] = {}
    many = compose_many(CASES, stats=stats)
    assert [_shown(r) for r in many] == [_outcome(compose_config, o) for o in CASES]
    assert stats["merged"] == 0 and stats["fallback"] > 0 and stats["fast"] > 0


def test_sweep_settings_equal_their_overrides():
    points = expand(SweepDef(name="s q", base=("logging.wandb_tags=[x]",),
                             axes=(("optim.lr=1e-3,3e-3",), ("model=tiny,debug",)),
                             run_name="it's {lr} \\ {model}"))
    composed = compose_many([p.overrides for p in points], settings=[p.settings for p in points])
    for point, got in zip(points, composed):
        assert got == compose_config(list(point.run_overrides))
        assert got.name == point.name and got.logging.wandb_tags == list(point.tags)


def test_invalid_points_carry_the_single_run_messages():
    sweep = inline_sweep(["model=tiny", "training.device=cpu", "cluster.procs_per_node=2",
                          "training.seq_len=32,512", "parallel.dp_replicate=2,3"])
    checked = validate(expand(sweep), host=CPU)
    assert [c.valid for c in checked] == [True, False, False, False]
    for c in checked[1:]:
        with pytest.raises(ConfigError) as single:
            resolve(compose_config(list(c.point.run_overrides)), host=CPU)
        assert [p.render() for p in c.problems] == [p.render() for p in single.value.problems]
    text = str(InvalidSweep([c for c in checked if not c.valid], len(checked)))
    assert text.startswith("Invalid sweep: 3 of 4 points have problems:")
    assert "point 3 [seq_len=512 dp_replicate=3] (Invalid run config, 2 problems):" in text
    assert "training.seq_len=512: " in text and "dp_replicate(3)" in text
    assert "nothing was submitted" in text


def test_cluster_nodes_is_not_a_sweep_backend():
    sweep = inline_sweep(["cluster=nodes", "cluster.rdzv_host=h", "cluster.gpus_per_node=0",
                          "optim.lr=1,2"])
    checked = validate(expand(sweep), host=CPU)
    assert not any(c.valid for c in checked)
    assert "sweeps run their points locally or on Slurm" in checked[0].problems[0].render()


def _render(table, width: int = 250) -> str:
    console = Console(width=width, record=True)
    console.print(table)
    return console.export_text()


def test_preview_on_cpu_has_no_fit_column():
    checked = validate(expand(inline_sweep(["model=tiny", "training.device=cpu",
                                            "optim.lr=1e-3,3e-3"])), host=CPU)
    text = _render(preview_table(checked, title="t"))
    assert "fits" not in text and "GiB/rank" in text and "2 pts" in text
    assert "491.52K" in text  # 120 steps x micro-batch 16 x seq_len 128 x dp 2


def _row(text: str, word: str) -> list[str]:
    return [line for line in text.splitlines() if word in line][0].split()


def test_preview_on_gpus_says_what_fits():
    sweep = inline_sweep(["data=synthetic", "cluster=slurm", "cluster.gpus_per_node=8",
                          "training.seq_len=2048", "training.steps=100",
                          "training.micro_batch_size=1",
                          "model=llama3_1b,llama3_8b"])
    checked = validate(expand(sweep), host=CPU)
    text = _render(preview_table(checked, title="t"))
    assert "fits" in text and "1 do not fit" in text
    small, large = _row(text, "llama3_1b"), _row(text, "llama3_8b")
    assert small[4] == "yes" and large[4] == "NO"
    need, usable = (float(x) for x in large[3].split("/"))
    assert usable == 73.6 and need > usable  # 92% of the H100's 80 GiB
    assert float(large[-1]) > float(small[-1]) > 0  # GPU-hours


def test_preview_fits_80_columns_without_cutting_a_cell():
    sweep = inline_sweep(["data=synthetic", "cluster=slurm", "cluster.gpus_per_node=8",
                          "model=llama3_1b", "cluster.nodes=1,2,4", "precision=bf16,fp8",
                          "training.micro_batch_size=1,2", "recompute=none,selective"])
    checked = validate(expand(sweep), host=CPU)
    text = _render(preview_table(checked, title="t"), width=80)
    lines = text.splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines) and "\N{HORIZONTAL ELLIPSIS}" not in text
    assert _row(text, "selective")[-1] != "" and "GPU-h" in text and "16 (2n)" in text


def test_points_with_the_same_resources_share_an_array():
    from pathlib import Path

    from sweeps.run_local import Prepared
    from launcher.backends.slurm_arrays import group_by_resources

    sweep = inline_sweep(["cluster=slurm", "cluster.gpus_per_node=0", "cluster.procs_per_node=2",
                          "cluster.nodes=1,2", "optim.lr=1e-3,3e-3,1e-2"])
    checked = validate(expand(sweep), host=CPU)
    prepared = [Prepared(index=c.point.index, name=c.point.name, spec=c.spec, run_dir=Path("x"))
                for c in checked]
    groups = group_by_resources(prepared)
    assert [[p.index for p in g] for g in groups] == [[0, 1, 2], [3, 4, 5]]


def test_a_point_is_known_by_its_overrides(tmp_path):
    state = SweepState.load(tmp_path / "s", name="s")
    first = state.merge(expand(inline_sweep(["optim.lr=1,2"], name="s")))
    grown = state.merge(expand(inline_sweep(["optim.lr=0.5,1,2,3"], name="s")))
    assert [p.index for p in first] == [0, 1]
    assert [(p.index, p.values["optim.lr"]) for p in grown] == [(2, "0.5"), (0, "1"), (1, "2"),
                                                                 (3, "3")]
    assert not (tmp_path / "s").exists()  # nothing is written until save()
