"""One launcher per run dir: the lock refuses a live holder by name, takes over a dead one's,
and a refused `meshrun resume` writes nothing. Holders are real processes."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conf.errors import ConfigError
from launcher.backends.run_lock import acquire_run_lock
from tests.support.meshrun_cli import meshrun

REPO = Path(__file__).resolve().parents[2]
HOLDER = textwrap.dedent("""
    import sys, time
    from launcher.backends.run_lock import acquire_run_lock
    lock = acquire_run_lock(sys.argv[1], action="run")
    print("held", flush=True)
    time.sleep(120)
""")


@pytest.fixture
def holder(tmp_path):
    """A live process holding tmp_path's lock (killed at the end)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout.readline().strip() == "held"
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_holder_is_refused_by_name(tmp_path, holder):
    with pytest.raises(ConfigError) as err:
        acquire_run_lock(tmp_path, action="resume")
    text = str(err.value)
    assert f"pid {holder.pid} on host {socket.gethostname()}" in text
    assert "Cannot resume" in text and f"kill {holder.pid}" in text


def test_a_killed_holders_lock_is_taken_over_with_a_notice(tmp_path, holder, capfd):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    with acquire_run_lock(tmp_path, action="resume"):
        record = json.loads((tmp_path / "launcher.lock").read_text())
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    err = capfd.readouterr().err
    assert "stale lock" in err and f"pid {holder.pid}" in err and "has exited" in err


def test_a_clean_release_leaves_no_stale_record(tmp_path, capfd):
    with acquire_run_lock(tmp_path, action="run"):
        pass
    assert (tmp_path / "launcher.lock").read_text() == ""
    with acquire_run_lock(tmp_path, action="run"):
        pass
    assert "stale" not in capfd.readouterr().err


def test_a_record_from_another_host_is_refused(tmp_path):
    (tmp_path / "launcher.lock").write_text(json.dumps(
        {"host": "elsewhere-node-7", "pid": 4242, "started": "yesterday"}))
    with pytest.raises(ConfigError, match="pid 4242 on host elsewhere-node-7"):
        acquire_run_lock(tmp_path, action="resume")


def test_meshrun_resume_of_a_held_run_dir_exits_2_and_writes_nothing(tmp_path, holder):
    (tmp_path / "spec.json").write_text("{}")
    (tmp_path / "overrides.json").write_text("[]")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = meshrun("resume", str(tmp_path), timeout=120,
                     env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2, result.stderr
    assert f"is in use by meshrun pid {holder.pid}" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "spec.json").read_text() == "{}"
