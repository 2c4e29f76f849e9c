"""benchmarks/plan_corpus.py: its corpus covers every pair of options, a few of its cases
written twice in this process are byte-identical, and compare flags a changed or missing case."""
from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATH = REPO / "benchmarks" / "plan_corpus.py"
_spec = importlib.util.spec_from_file_location("plan_corpus", PATH)
corpus = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = corpus  # dataclasses look their module up there
_spec.loader.exec_module(corpus)

SPEC = next(c.path.removeprefix("dry_run/") for c in corpus.all_cases(REPO, Path("/runs"))
            if c.path.startswith("dry_run/tiny-"))
"""The first tiny-model spec that has a dry run: its plan, plan --json and dry run."""


def test_every_pair_of_options_of_two_axes_is_planned():
    specs = [c.path.removeprefix("plan/").removesuffix(".txt").split("-")
             for c in corpus.all_cases(REPO, Path("/runs")) if c.path.startswith("plan/")]
    axes = list(zip(*specs))  # model, layout, recompute, precision, device
    for a, b in itertools.combinations(axes, 2):
        assert len(set(zip(a, b))) == len(set(a)) * len(set(b))
    assert len(set(axes[0])) == len(corpus.options(REPO, "model")) - 1  # all but hf


def test_no_case_can_launch():
    cases = corpus.all_cases(REPO, Path("/runs"))
    assert not [c.argv for c in cases if corpus.may_launch(c.argv)]
    assert corpus.may_launch(("run", "model=tiny"))
    assert corpus.may_launch(("sweep", "-f", "x"))


def test_masked_hides_only_the_runs_dir_repo_and_time():
    text = f"/out/runs/{corpus.RUN_NAME}-20261202-071524/x and {REPO}/conf and 20261202-071524"
    assert corpus.masked(text, runs_dir=Path("/out/runs"), repo=REPO) == \
        f"<runs_dir>/{corpus.RUN_NAME}-<time>/x and <repo>/conf and 20261202-071524"


@pytest.fixture(scope="module")
def two_writes(tmp_path_factory):
    """SPEC's cases written twice, into folders of different path lengths."""
    dirs = [tmp_path_factory.mktemp("corpus") / name for name in ("first", "second-longer-path")]
    for d in dirs:
        assert corpus.write(d, REPO, only=SPEC) == 0
    return dirs


def test_two_writes_are_identical(two_writes, capsys):
    first, second = two_writes
    written = (first / "index.txt").read_text().split()
    assert sorted(written) == [f"{kind}/{SPEC}" for kind in ("dry_run", "plan", "plan_json")]
    assert corpus.compare(first, second) == 0
    assert "3 cases: 3 identical, 0 differ" in capsys.readouterr().out
    dry_run = (first / "dry_run" / SPEC).read_text()
    assert "exit status: 0" in dry_run and f"<runs_dir>/{corpus.RUN_NAME}-<time>" in dry_run
    assert not (first / corpus.RUNS_SUBDIR).exists()


def test_compare_flags_a_changed_and_a_missing_case(two_writes, tmp_path, capsys):
    first, _ = two_writes
    changed = tmp_path / "changed"
    for path, data in corpus.case_files(first).items():
        (changed / path).parent.mkdir(parents=True, exist_ok=True)
        (changed / path).write_bytes(data)
    plan = changed / "plan" / SPEC
    plan.write_text(plan.read_text().replace("exit status: 0", "exit status: 1"))
    (changed / "plan_json" / SPEC).unlink()
    assert corpus.compare(first, changed) == 1
    out = capsys.readouterr().out
    assert "3 cases: 1 identical, 2 differ (1 only in" in out
    assert "-exit status: 0\n+exit status: 1" in out
