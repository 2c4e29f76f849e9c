"""Sweep files and expansion: grid, zip, random (seeded), explicit lists, inline axes, Hydra's
range/choice/glob, run names, W&B group and tags. Pure and fast: no Hydra compose, no runs."""
from __future__ import annotations

import pytest

from conf.errors import ConfigError
from conf.compose import parse_override, quote_value
from conf.overrides import group_options
from sweeps.expand import Point, expand
from sweeps.spec_file import SweepDef, extend, inline_sweep, load_sweep_file


def values(points: list[Point]) -> list[dict[str, str]]:
    return [p.values for p in points]


def test_grid_is_the_product_with_the_first_axis_slowest():
    sweep = SweepDef(name="g", base=("model=tiny",),
                     axes=(("optim.lr=1e-4,3e-4",), ("schedule.warmup_steps=0,5,10",)))
    points = expand(sweep)
    assert [p.index for p in points] == list(range(6))
    assert values(points)[:4] == [
        {"optim.lr": "0.0001", "schedule.warmup_steps": "0"},
        {"optim.lr": "0.0001", "schedule.warmup_steps": "5"},
        {"optim.lr": "0.0001", "schedule.warmup_steps": "10"},
        {"optim.lr": "0.0003", "schedule.warmup_steps": "0"}]
    assert points[1].overrides == ("model=tiny", "optim.lr=0.0001", "schedule.warmup_steps=5")


def test_inline_overrides_split_into_base_and_axes():
    sweep = inline_sweep(["model=llama3_1b", "optim.lr=1e-4,3e-4,1e-3", "name='a,b'"])
    assert sweep.base == ("model=llama3_1b", "name='a,b'")
    assert sweep.axes == (("optim.lr=1e-4,3e-4,1e-3",),)
    assert len(expand(sweep)) == 3
    assert inline_sweep(["optim.lr=1,2"]).name == inline_sweep(["optim.lr=1,2"]).name
    assert inline_sweep(["optim.lr=1,2"]).name != inline_sweep(["optim.lr=1,3"]).name


def test_range_choice_and_glob_follow_hydra():
    sweep = inline_sweep(["training.steps=range(10,40,10)", "optim.lr=choice(0.1,0.2)",
                          "model=glob(llama3_*,exclude=llama3_70b)"])
    points = expand(sweep)
    llamas = [m for m in group_options("model") if m.startswith("llama3_") and m != "llama3_70b"]
    assert len(points) == 3 * 2 * len(llamas)
    assert sorted({p.values["model"] for p in points}) == sorted(llamas)
    assert sorted({p.values["training.steps"] for p in points}) == ["10", "20", "30"]
    added = inline_sweep(["+experiment=glob(*)"])
    assert [p.overrides[-1] for p in expand(added)] == [
        f"+experiment={e}" for e in group_options("experiment")]


def test_zip_pairs_axes_and_needs_equal_lengths():
    sweep = SweepDef(name="z", axes=(("optim.lr=1,2,3",), ("training.seed=7,8,9",)), combine="zip")
    assert values(expand(sweep)) == [{"optim.lr": v, "training.seed": s}
                                     for v, s in (("1", "7"), ("2", "8"), ("3", "9"))]
    with pytest.raises(ConfigError, match="equal lengths"):
        expand(SweepDef(name="z", axes=(("optim.lr=1,2",), ("training.seed=7,8,9",)),
                        combine="zip"))


def test_paired_axes_inside_a_grid():
    sweep = SweepDef(name="p", axes=(("precision=fp32,bf16",),
                                     ("training.micro_batch_size=4,8", "training.seed=1,2")))
    got = values(expand(sweep))
    assert len(got) == 4
    assert {(v["training.micro_batch_size"], v["training.seed"]) for v in got} == {("4", "1"),
                                                                                   ("8", "2")}


def test_random_sampling_is_seeded_distinct_and_deterministic():
    axes = (("optim.lr=range(1,11)",), ("training.seed=range(0,10)",))
    one = expand(SweepDef(name="r", axes=axes, combine="random", samples=12, seed=3))
    again = expand(SweepDef(name="r", axes=axes, combine="random", samples=12, seed=3))
    other = expand(SweepDef(name="r", axes=axes, combine="random", samples=12, seed=4))
    assert values(one) == values(again) and values(one) != values(other)
    assert len({tuple(v.items()) for v in values(one)}) == 12  # drawn without replacement
    with pytest.raises(ConfigError, match="more than the 100 distinct points"):
        expand(SweepDef(name="r", axes=axes, combine="random", samples=101))


def test_random_interval_axes_draw_within_bounds():
    sweep = SweepDef(name="r", axes=(("optim.lr=tag(log,interval(1e-5,1e-2))",),
                                     ("training.seed=1,2",)), combine="random", samples=20, seed=0)
    lrs = [float(p.values["optim.lr"]) for p in expand(sweep)]
    assert len(lrs) == 20 and all(1e-5 <= lr <= 1e-2 for lr in lrs)
    assert min(lrs) < 1e-4 < max(lrs)  # log-uniform reaches the small decades
    with pytest.raises(ConfigError, match="interval"):
        expand(SweepDef(name="g", axes=(("optim.lr=interval(0,1)",),)))


def test_explicit_list_of_points_times_an_axis():
    sweep = SweepDef(name="l", combine="list", points=(("optim.lr=1e-3", "model=tiny"),
                                                       ("optim.lr=3e-3",)),
                     axes=(("training.seed=1,2",),))
    points = expand(sweep)
    assert [p.overrides for p in points] == [
        ("optim.lr=1e-3", "model=tiny", "training.seed=1"),
        ("optim.lr=1e-3", "model=tiny", "training.seed=2"),
        ("optim.lr=3e-3", "training.seed=1"), ("optim.lr=3e-3", "training.seed=2")]


def test_shuffle_uses_the_sweep_seed():
    sweep = SweepDef(name="s", axes=(("training.seed=shuffle(1,2,3,4,5,6,7,8)",),), seed=5)
    first = values(expand(sweep))
    assert first == values(expand(sweep)) and sorted(v["training.seed"] for v in first) == [
        str(i) for i in range(1, 9)]


def test_names_group_and_tags():
    sweep = SweepDef(name="lrs", base=("logging.wandb_tags=[base]",),
                     axes=(("optim.lr=1e-3,3e-3",), ("model=tiny,debug",)),
                     run_name="{sweep}-{index}-lr{lr}-{model}")
    point = expand(sweep)[3]
    assert point.name == "lrs-3-lr0.003-debug"
    assert point.group == "lrs"
    assert point.tags == ("base", "optim.lr=0.003", "model=debug")
    assert point.run_overrides[-3:] == (
        "name='lrs-3-lr0.003-debug'", "logging.wandb_group='lrs'",
        "logging.wandb_tags=['base','optim.lr=0.003','model=debug']")
    default = expand(SweepDef(name="d", axes=(("optim.lr=1e-3",), ("training.seed=1",))))[0]
    assert default.name == "lr=0.001-seed=1"
    own_group = expand(SweepDef(name="x", base=("logging.wandb_group=mine",),
                                axes=(("optim.lr=1",),)))[0]
    assert own_group.group == "" and "logging.wandb_group" not in own_group.settings
    with pytest.raises(ConfigError, match=r"unknown field \{nope\}"):
        expand(SweepDef(name="t", axes=(("optim.lr=1",),), run_name="{nope}"))


@pytest.mark.parametrize("text", ["a b", "it's", "back\\slash", "x\\", "q\\'z", 'd"q',
                                  "a,b=c[]", "new\nline"])
def test_quoted_values_round_trip(text):
    assert parse_override(f"name={quote_value(text)}").value == text


def test_axis_problems_are_reported_together():
    sweep = SweepDef(name="bad", axes=(("optim.lr=1,2",), ("optim.lr=3,4",),
                                       ("training.steps=glob(*)",), ("model=glob(nothing*)",)))
    with pytest.raises(ConfigError) as err:
        expand(sweep)
    text = str(err.value)
    assert "3 problems" in text and "swept by two axes" in text
    assert "glob() selects options of a config group" in text and "matches no model" in text
    with pytest.raises(ConfigError, match="more than 10,000 points"):
        expand(inline_sweep(["training.seed=range(0,100)", "optim.lr=range(1,101)",
                             "training.steps=range(1,12)"]))


def test_sweep_file_problems_are_reported_together(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("nme: x\naxes:\n  - optim.lr: 1\n  - [a=1,2]\ncombine: random\n")
    with pytest.raises(ConfigError) as err:
        load_sweep_file(path)
    text = str(err.value)
    for want in ("nme: unknown sweep file key (fix: did you mean name?)",
                 "one override string", "combine: random needs the number of points"):
        assert want in text


def test_command_line_values_pin_swept_keys(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text('axes:\n  - optim.lr=1,2\n  - ["training.seed=1,2", "training.steps=5,6"]\n')
    sweep = extend(load_sweep_file(path), ["training.seed=9", "model=tiny,debug"], combine="grid")
    assert sweep.name == "s"
    assert sweep.base == ("training.seed=9",)
    assert sweep.axes == (("optim.lr=1,2",), ("training.steps=5,6",), ("model=tiny,debug",))
