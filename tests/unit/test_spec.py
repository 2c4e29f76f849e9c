"""The frozen spec is derived from the schema, holds Enums, and round-trips through spec.json."""
from __future__ import annotations

import dataclasses
import json
import typing
from enum import Enum

import pytest

from conf import schema, spec
from conf.run_dir.spec_io import read_spec, spec_to_dict, write_spec
from parallel.dims import ParallelDims
from tests.support.specs import cpu_spec

SECTIONS = {
    spec.ModelSpec: schema.ModelConfig, spec.PrecisionSpec: schema.PrecisionConfig,
    spec.ParallelSpec: schema.ParallelConfig, spec.RecomputeSpec: schema.RecomputeConfig,
    spec.ScheduleSpec: schema.ScheduleConfig, spec.OptimSpec: schema.OptimConfig,
    spec.DataSpec: schema.DataConfig, spec.TrainingSpec: schema.TrainingConfig,
    spec.CheckpointSpec: schema.CheckpointConfig, spec.ClusterSpec: schema.ClusterConfig,
    spec.LoggingSpec: schema.LoggingConfig,
}
ADDED = {spec.PrecisionSpec: ["compute_dtype"], spec.DataSpec: ["vocab_size", "eos_id"]}


@pytest.mark.parametrize("section", SECTIONS, ids=lambda c: c.__name__)
def test_each_section_has_its_schema_fields_in_order_frozen(section):
    config = SECTIONS[section]
    names = [f.name for f in dataclasses.fields(section)]
    assert [n for n in names if n not in ADDED.get(section, [])] == [
        f.name for f in dataclasses.fields(config)]
    params = section.__dataclass_params__
    assert params.frozen and hasattr(section, "__slots__")
    hints, config_hints = typing.get_type_hints(section), typing.get_type_hints(config)
    for name, kind in config_hints.items():
        if typing.get_origin(kind) is list:
            assert typing.get_origin(hints[name]) is tuple, name
        elif isinstance(kind, type) and issubclass(kind, Enum):
            assert isinstance(hints[name], type) and issubclass(hints[name], Enum), name
    assert config.__name__ in section.__doc__


def test_resolved_spec_holds_enum_members_and_spec_json_round_trips(tmp_path):
    run = cpu_spec("parallel=pp", "cluster.procs_per_node=2", "recompute.mode=full")
    assert run.precision.name is schema.Precision.fp32
    assert run.precision.compute_dtype is schema.DType.fp32
    assert run.training.device is schema.DeviceKind.cpu
    assert run.cluster.kind is schema.ClusterKind.local
    assert run.recompute.mode is schema.RecomputeMode.full
    assert f"{run.precision.name}/{run.training.device}" == "fp32/cpu"  # print as values
    write_spec(run, tmp_path / "spec.json")
    written = json.loads((tmp_path / "spec.json").read_text())
    assert written["precision"]["name"] == "fp32" and written["cluster"]["kind"] == "local"
    assert written["training"]["device"] == "cpu" and written["recompute"]["mode"] == "full"
    assert list(written["precision"]) == ["name", "compute_dtype", "reduce_dtype",
                                          "loss_scale_init", "optimizer_state_dtype"]
    back = read_spec(tmp_path / "spec.json")
    assert back == run
    assert back.precision.name is schema.Precision.fp32
    assert back.training.device is schema.DeviceKind.cpu
    assert back.cluster.kind is schema.ClusterKind.local
    assert spec_to_dict(back) == written


def test_stage_count_and_checkpoint_layout_come_from_the_parallel_spec():
    run = cpu_spec("parallel=pp", "cluster.procs_per_node=2", "model.n_layers=4",
                   "parallel.pp_schedule=interleaved_1f1b", "parallel.pp_virtual_stages=2")
    p = run.parallel
    assert p.n_stages == 4 and p.pp_microbatches == 4
    dims = ParallelDims.from_spec(p)
    assert (dims.pp, dims.dp, dims.world_size, dims.parallel) == (2, 1, 2, p)
    assert dims.checkpoint_degrees() == {
        "world_size": 2, "dp_replicate": 1, "dp_shard": 1, "tp": 1, "pp": 2, "cp": 1,
        "zero": 0, "pp_virtual_stages": 2, "ep": 1}
    single = ParallelDims.single()
    assert single.world_size == 1 and single.shape == (1, 1, 1, 1, 1)


def test_a_spec_json_from_before_later_knobs_still_reads(tmp_path):
    """Knobs added after a run was made (nonfinite, prepared data, W&B system metrics) take
    their defaults when an older spec.json lacks them, so such a run can still be resumed."""
    data = spec_to_dict(cpu_spec())
    for section, key in (("training", "nonfinite"), ("data", "prepared"), ("data", "tokenizer"),
                         ("logging", "wandb_system_metrics"), ("logging", "wandb_console"),
                         ("logging", "wandb_system_metrics_interval_s")):
        del data[section][key]
    (tmp_path / "spec.json").write_text(json.dumps(data))
    old = read_spec(tmp_path / "spec.json")
    assert old.training.nonfinite.value == "stop" and old.logging.wandb_console is True
    del data["training"]["steps"]  # a knob every spec has: still required
    (tmp_path / "spec.json").write_text(json.dumps(data))
    with pytest.raises(KeyError):
        read_spec(tmp_path / "spec.json")


def test_the_required_knobs_table_names_only_schema_knobs():
    """FIRST_SPEC_JSON_KNOBS lists, per section, knobs that exist (a renamed or removed knob
    would otherwise silently become optional)."""
    for config, names in spec.FIRST_SPEC_JSON_KNOBS.items():
        known = {f.name for f in dataclasses.fields(config)}
        assert set(names.split()) <= known, (config.__name__, set(names.split()) - known)
    assert set(spec.FIRST_SPEC_JSON_KNOBS) == set(SECTIONS.values())


def test_a_new_knob_needs_only_its_schema_field(monkeypatch):
    """A knob added to a schema section takes its schema default in the frozen spec, with no
    list to extend; the table's knobs stay required."""
    grown = dataclasses.make_dataclass(
        "TrainingConfig", [("new_knob", int, dataclasses.field(default=3)),
                           ("new_env", dict[str, str], dataclasses.field(default_factory=dict))],
        bases=(schema.TrainingConfig,))
    table = spec.FIRST_SPEC_JSON_KNOBS
    monkeypatch.setattr(spec, "FIRST_SPEC_JSON_KNOBS",
                        {**table, grown: table[schema.TrainingConfig]})

    @spec.frozen_from(grown)
    class GrownSpec:
        pass

    fields = {f.name: f for f in dataclasses.fields(GrownSpec)}
    assert fields["new_knob"].default == 3 and fields["new_env"].default_factory() == {}
    assert fields["steps"].default is dataclasses.MISSING
