"""Bad input that used to fail after launch (a rank traceback, a run dir left) or pass silently:
each is refused before launch through the real `meshrun` entry point, with exit 2, no
traceback, the key or path named, and nothing written (no run dir, no run-dir file changed)."""
from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest

from conf.compose import compose_config
from conf.resolve import resolve
from conf.run_dir.paths import RunDir
from conf.run_dir.spec_io import write_spec
from launcher import cli
from parallel.dims import ParallelDims
from tests.support.specs import CPU_HOST

TMP = "{tmp}"
LONG = "x" * 65
CPU2 = ["training.device=cpu", "cluster.procs_per_node=2", "training.steps=10",
        "logging=disabled"]

RUN_CASES = {  # id: (overrides, substrings of stderr)
    "wandb-tag-65-chars": ([f"logging.wandb_tags=[ok,{LONG}]"],
                           ["logging.wandb_tags[1]", "65 characters", "1 to 64"]),
    "wandb-tag-empty": (["logging.wandb_tags=['']"], ["logging.wandb_tags[0]", "remove"]),
    "wandb-project-slash": (["logging.wandb_project=team/proj"],
                            ["logging.wandb_project='team/proj'", "refuses", "wandb_entity"]),
    "wandb-project-hash": (["logging.wandb_project='a#b'"], ["logging.wandb_project", "#"]),
    "wandb-project-colon": (["logging.wandb_project='a:b'"], ["logging.wandb_project", ":"]),
    "wandb-project-question": (["logging.wandb_project='a?b'"], ["logging.wandb_project", "?"]),
    "wandb-project-percent": (["logging.wandb_project='a%b'"], ["logging.wandb_project", "%"]),
    "wandb-project-backslash": (["logging.wandb_project='a\\\\b'"], ["logging.wandb_project"]),
    "wandb-project-129-chars": ([f"logging.wandb_project={'p' * 129}"],
                                ["logging.wandb_project", "129 characters", "at most 128"]),
    "wandb-project-blank": (["logging.wandb_project=' '"], ["logging.wandb_project",
                                                           "must not be empty"]),
    "wandb-entity-slash": (["logging.wandb_entity=a/b"], ["logging.wandb_entity='a/b'"]),
    "wandb-entity-percent": (["logging.wandb_entity='a%b'"], ["logging.wandb_entity", "%"]),
    "wandb-group-colon": (["logging.wandb_group='g:1'"], ["logging.wandb_group"]),
    "runs-dir-is-a-file": (["runs_dir={tmp}/afile"], ["runs_dir={tmp}/afile",
                                                      "is an existing file"]),
    "runs-dir-under-a-file": (["runs_dir={tmp}/afile/runs"], ["runs_dir=", "which is a file"]),
    "cache-dir-is-a-file": (["data.cache_dir={tmp}/afile"], ["data.cache_dir={tmp}/afile",
                                                             "is an existing file"]),
    "name-300-chars": ([f"name={'n' * 300}"], ["name=nnnn", "300 characters", "255-byte"]),
    "name-230-chars": ([f"name={'n' * 230}"], ["name=", "255-byte", "at most 222"]),
    "recompute-targets-nested": (["recompute.targets=[[a]]"],
                                 ["recompute.targets", "flat list", "no nested lists"]),
    "recompute-targets-nested-selective": (["recompute.mode=selective",
                                            "recompute.targets=[[a]]"],
                                           ["recompute.targets", "flat list"]),
    "recompute-target-unknown": (["recompute.targets=[bogus]"],
                                 ["recompute.targets", "unknown target(s) bogus", "swiglu"]),
    "wandb-tags-nested": (["logging.wandb_tags=[[a,b]]"], ["logging.wandb_tags", "flat list"]),
    "load-from-step-without-dcp-metadata": (["checkpoint.load_from={tmp}/step_00000005"],
                                            ["checkpoint.load_from={tmp}/step_00000005",
                                             "without .metadata"]),
    "load-from-random-dir": (["checkpoint.load_from={tmp}/random"],
                             ["checkpoint.load_from={tmp}/random", "neither a step_N"]),
    "load-from-a-file": (["checkpoint.load_from={tmp}/afile"],
                         ["checkpoint.load_from={tmp}/afile", "is a file"]),
    "load-from-missing": (["checkpoint.load_from={tmp}/nope"], ["{tmp}/nope", "does not exist"]),
    "load-from-run-with-only-tmp": (["checkpoint.load_from={tmp}/halfrun"],
                                    ["{tmp}/halfrun", "no complete checkpoint under"]),
}


def _fill(text: str, tmp: Path) -> str:
    return text.replace(TMP, str(tmp))


@pytest.fixture
def junk(tmp_path) -> Path:
    """Things that look like folders or checkpoints and are not."""
    (tmp_path / "afile").write_text("not a folder\n")
    (tmp_path / "step_00000005").mkdir()
    (tmp_path / "step_00000005" / "meta.json").write_text('{"world_size": 2}')
    (tmp_path / "random" / "stuff").mkdir(parents=True)
    (tmp_path / "halfrun" / "checkpoints" / "step_00000005.tmp").mkdir(parents=True)
    return tmp_path


def _refused(argv: list[str], capsys) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha1(p.read_bytes()).hexdigest() if p.is_file()
            else "dir" for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("name", sorted(RUN_CASES))
def test_run_is_refused_before_launch(name, junk, capsys):
    overrides, expect = RUN_CASES[name]
    runs = junk / "runs"
    args = [_fill(o, junk) for o in overrides]
    if not any(a.startswith("runs_dir=") for a in args):
        args.append(f"runs_dir={runs}")
    before = _snapshot(junk)
    err = _refused(["run", *CPU2, *args], capsys)
    missing = [e for e in (_fill(e, junk) for e in expect) if e not in err]
    assert not missing, f"{missing} not in:\n{err}"
    assert not runs.exists() and _snapshot(junk) == before


# ---- meshrun resume ------------------------------------------------------------------------

STORED = [*CPU2, "parallel=ddp"]


def _run_dir(root: Path) -> Path:
    """A run dir as a ddp run with 2 ranks leaves it after its checkpoint at step 5."""
    run = root / "run-1"
    step = run / "checkpoints" / "step_00000005"
    step.mkdir(parents=True)
    spec = resolve(compose_config(STORED), host=CPU_HOST, check_paths=False)
    write_spec(spec, run / "spec.json")
    (run / "overrides.json").write_text(json.dumps(STORED))
    (run / "config.yaml").write_text("name: run\n")
    degrees = ParallelDims.from_spec(spec.parallel).checkpoint_degrees()
    (step / "meta.json").write_text(json.dumps({"step": 5, "world_size": 2,
                                                "metadata": {"world_size": 2,
                                                             "layout": degrees}}))
    (step / ".metadata").write_bytes(pickle.dumps({}))  # readable, names no class (no torch)
    return run


RESUME_CASES = {  # id: (how the run dir is spoiled, extra overrides, substrings of stderr)
    "resume-ddp-to-fsdp-same-world": (None, ["parallel=fsdp"],
                                      ["parallel (fsdp)", "dp_shard=2", "dp_replicate=2",
                                       "checkpoint.load_from=", "step_00000005"]),
    "resume-other-seq-len": (None, ["training.seq_len=64"],
                             ["training.seq_len=64", "training.seq_len=128",
                              "checkpoint.load_from="]),
    "resume-overrides-not-json": (("overrides.json", "[oops"), [],
                                  ["overrides.json", "cannot be read as JSON"]),
    "resume-overrides-a-dict": (("overrides.json", '{"a": 1}'), [],
                                ["overrides.json", "JSON list of override strings", "dict"]),
    "resume-overrides-not-strings": (("overrides.json", "[1, 2]"), [],
                                     ["overrides.json", "JSON list of override strings"]),
    "resume-spec-not-json": (("spec.json", "{"), [], ["spec.json", "cannot be read as JSON"]),
    "resume-spec-a-list": (("spec.json", "[]"), [], ["spec.json", "must be a JSON object"]),
    "resume-meta-not-json": (("checkpoints/step_00000005/meta.json", "{nope"), [],
                             ["step_00000005", "meta.json", "JSON"]),  # the integrity check names it first
    "resume-meta-a-list": (("checkpoints/step_00000005/meta.json", "[2]"), [],
                           ["step_00000005/meta.json", "integer world_size"]),
    "resume-meta-world-size-text": (("checkpoints/step_00000005/meta.json",
                                     '{"world_size": "2"}'), [],
                                    ["meta.json", "integer world_size"]),
}


@pytest.mark.parametrize("name", sorted(RESUME_CASES))
def test_resume_is_refused_before_launch(name, tmp_path, capsys):
    spoil, extra, expect = RESUME_CASES[name]
    run = _run_dir(tmp_path)
    if spoil:
        (run / spoil[0]).write_text(spoil[1])
    before = _snapshot(run)
    err = _refused(["resume", str(run), *extra], capsys)
    missing = [e for e in expect if e not in err]
    assert not missing, f"{missing} not in:\n{err}"
    assert _snapshot(run) == before and not RunDir(run).lock_file.exists()


def test_resume_same_layout_passes_the_checks(tmp_path):
    from launcher.commands import _check_resumable, compose_spec

    run = _run_dir(tmp_path)
    spec, _ = compose_spec([*STORED, f"checkpoint.resume_from={run}"])
    _check_resumable(run, spec)  # raises nothing


# ---- sweeps and compare --------------------------------------------------------------------

SWEEP_CASES = {
    "sweep-range-1e8": (["optim.lr=range(0,100000000)"], ["100,000,000 values", "--max-points"]),
    "sweep-random-1e8-samples": (["--combine", "random", "--samples", "100000000",
                                  "optim.lr=0.1,0.2"], ["samples=100,000,000", "--max-points"]),
    "sweep-random-1e8-interval": (["--combine", "random", "--samples", "100000000",
                                   "optim.lr=interval(0.1,1)"], ["samples=100,000,000"]),
    "sweep-grid-over-cap": (["training.seed=range(0,200)", "optim.lr=range(1,101)"],
                            ["200 x 100 = 20,000 points", "more than 10,000"]),
    "sweep-grid-over-lowered-cap": (["--max-points", "3", "optim.lr=1,2,3,4"],
                                    ["more than 3 points"]),
}


@pytest.mark.parametrize("name", sorted(SWEEP_CASES))
def test_sweep_too_big_is_refused_before_points_are_made(name, tmp_path, capsys):
    words, expect = SWEEP_CASES[name]
    err = _refused(["sweep", "--dry-run", *words, f"runs_dir={tmp_path}/runs"], capsys)
    assert all(e in err for e in expect), err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("what", ["empty", "missing", "file", "no-runs"])
def test_compare_with_nothing_to_compare_exits_2(what, tmp_path, capsys):
    path = tmp_path / what
    if what == "empty":
        path.mkdir()
    elif what == "file":
        path.write_text("x")
    elif what == "no-runs":
        (path / "sub").mkdir(parents=True)
    err = _refused(["compare", str(path)], capsys)
    assert str(path) in err and "Nothing to compare" in err
