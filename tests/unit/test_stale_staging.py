"""A `meshrun data` command killed with SIGKILL leaves its hidden staging folder beside --out;
the next call of the same command for the same --out removes it, and never one a live process
holds, one of another command, or one of another --out that shares the name's prefix.

The owners are real processes that enter `staged_dir` and are killed with SIGKILL (a real
`train-tokenizer` holds its staging folder only for the moment it saves, too short to kill it
there deterministically); the next call is the real `meshrun data train-tokenizer`."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from launcher.data.stage_owner import OWNER_FILE, remove_stale_stages
from tests.support.meshrun_cli import REPO, meshrun
from tests.support.text_corpora import WORDS

TRAIN = "data train-tokenizer"
HOLD = """
import sys, time
from contextlib import ExitStack
from pathlib import Path
from launcher.data.output_dir import staged_dir
with ExitStack() as stack:
    for spec in sys.argv[1:]:
        out, command = spec.split("|")
        print(stack.enter_context(staged_dir(Path(out), command=command)), flush=True)
    time.sleep(600)
"""


def _hold(*specs: str) -> tuple[subprocess.Popen, list[Path]]:
    """A process holding a staging folder for each "out|command": it and the folders."""
    child = subprocess.Popen([sys.executable, "-c", HOLD, *specs], cwd=REPO,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    stages = [Path(child.stdout.readline().strip()) for _ in specs]
    assert all((s / OWNER_FILE).is_file() for s in stages), stages
    return child, stages


def _kill(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    child.stdout.close()


def test_next_call_removes_stages_of_killed_owners_only(tmp_path):
    out = tmp_path / "tok"
    live, (held,) = _hold(f"{out}|{TRAIN}")
    try:
        dead, (stale, other_command, other_out) = _hold(
            f"{out}|{TRAIN}", f"{out}|data prepare-sft", f"{tmp_path / 'tok-b'}|{TRAIN}")
        _kill(dead)
        assert stale.is_dir() and other_out.name.startswith(f".meshrun-{out.name}-")
        corpus = tmp_path / "corpus.txt"
        corpus.write_text(" ".join(WORDS * 40))
        done = meshrun("data", "train-tokenizer", "--vocab-size", "300", "--out", str(out),
                       str(corpus), timeout=120)
        assert done.returncode == 0, done.stderr
        assert (out / "tokenizer.json").is_file() and not (out / OWNER_FILE).exists()
        assert not stale.exists()
        assert held.is_dir() and other_command.is_dir() and other_out.is_dir()
    finally:
        _kill(live)
    assert remove_stale_stages(out, command=TRAIN) == [held]
    assert other_command.is_dir() and other_out.is_dir()
