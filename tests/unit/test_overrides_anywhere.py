"""Overrides anywhere on the command line (launcher/intermixed_args.py): before, between and
after flags, for every command that takes overrides, in the order typed; a left-over flag or
a word for a command without overrides is still refused (exit 2)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launcher.cli import build_parser, main
from launcher.intermixed_args import parse_intermixed


def parsed(*argv: str):
    return parse_intermixed(build_parser(), list(argv))


@pytest.mark.parametrize("argv, dest, want", [
    (["run", "a=1", "--dry-run", "b=2", "--force", "c=3"], "overrides", ["a=1", "b=2", "c=3"]),
    (["run", "--dry-run", "a=1", "a=2"], "overrides", ["a=1", "a=2"]),
    (["plan", "--search", "model=tiny", "--write-sweep", "best.yaml", "runs_dir=x"],
     "overrides", ["model=tiny", "runs_dir=x"]),
    (["plan", "--json", "model=tiny", "--attention-flops", "causal", "+experiment=smoke"],
     "overrides", ["model=tiny", "+experiment=smoke"]),
    (["resume", "runs/r", "--wait", "training.steps=9", "--force", "~logging.tags"],
     "overrides", ["training.steps=9", "~logging.tags"]),
    (["preflight", "--config-dir", "d", "cluster.procs_per_node=2"], "overrides",
     ["cluster.procs_per_node=2"]),
    (["sweep", "optim.lr=1e-4,1e-3", "--dry-run", "model=tiny", "--parallel", "2", "x=1"],
     "words", ["optim.lr=1e-4,1e-3", "model=tiny", "x=1"]),
    (["sweep", "status", "--json", "runs/sweeps/s"], "words", ["status", "runs/sweeps/s"]),
])
def test_overrides_after_flags_join_in_the_order_typed(argv, dest, want):
    assert getattr(parsed(*argv), dest) == want


def test_flags_keep_their_values_between_overrides():
    args = parsed("plan", "--search", "model=tiny", "--write-sweep", "best.yaml", "--top", "3",
                  "runs_dir=x")
    assert (args.search, args.write_sweep, args.top) == (True, Path("best.yaml"), 3)
    assert parsed("resume", "runs/r", "--wait", "a=1").run_dir == Path("runs/r")


@pytest.mark.parametrize("argv, named", [
    (["run", "a=1", "--no-such-flag", "b=2"], "--no-such-flag"),
    (["status", "runs/r", "extra=1"], "extra=1"),
])
def test_left_over_flags_and_words_are_still_refused(argv, named, capsys):
    with pytest.raises(SystemExit) as done:  # argparse's own exit, as before
        main(argv)
    assert done.value.code == 2
    assert f"unrecognized arguments: {named}" in capsys.readouterr().err


def test_plan_search_writes_a_sweep_with_the_override_typed_after_its_flags(tmp_path, capsys):
    """The issue's own line: `plan --search ... --write-sweep best.yaml runs_dir=...`."""
    out = tmp_path / "best.yaml"
    runs = tmp_path / "runs"
    assert main(["plan", "--search", "model=tiny", "--top", "1", "--global-batch-tokens", "2048",
                 "--write-sweep", str(out), f"runs_dir={runs}", "training.steps=7"]) == 0
    base = yaml.safe_load(out.read_text())["base"]
    assert base[:3] == ["model=tiny", f"runs_dir={runs}", "training.steps=7"]
    assert str(out) in capsys.readouterr().out
    assert not runs.exists()
