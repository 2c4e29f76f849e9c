"""On CUDA: training.memory_snapshot_step dumps the allocator's history after that step, and
training.memory_snapshot_on_oom dumps it when an allocation fails (before the error reaches
the loop); the profiler window records CUDA kernels. One process, a stand-in step (a matmul):
the loop's part (one call after each step) is checked on CPU by tests/unit/test_profile_knobs.py
and tests/distributed/test_profile_traces.py."""
from __future__ import annotations

import json
import pickle

import pytest
import torch

from conf.compose import compose_config
from conf.resolve import resolve
from launcher.hardware import probe_host
from training.step_probes import build_step_probes

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CUDA = torch.device("cuda")


def cuda_training(*overrides: str):
    cfg = compose_config(["logging=disabled", "model=tiny", "data=synthetic", "training.steps=4",
                          "cluster.procs_per_node=1", "training.device=cuda", *overrides])
    return resolve(cfg, host=probe_host(), check_paths=False).training


def run_steps(probes, steps: int) -> None:
    x = torch.randn(256, 256, device=CUDA)
    for step in range(1, steps + 1):
        x = (x @ x).tanh()
        torch.cuda.synchronize()
        if probes is not None:
            probes = probes.after_step(step)
    assert probes is None  # everything asked for is done


def test_a_snapshot_is_dumped_after_the_chosen_step(tmp_path):
    t = cuda_training("training.memory_snapshot_step=2")
    run_steps(build_step_probes(t, run_dir=tmp_path, rank=0, device=CUDA, done_step=0), 4)
    files = sorted(p.name for p in (tmp_path / "memory_snapshot").iterdir())
    assert files == ["rank0_step2.pickle"]
    snapshot = pickle.loads((tmp_path / "memory_snapshot" / files[0]).read_bytes())
    assert snapshot["segments"] and any(snapshot["device_traces"])  # history was recorded
    torch.cuda.memory._record_memory_history(enabled=None)


def test_the_profile_window_records_cuda_kernels(tmp_path):
    t = cuda_training("training.profile_steps=1", "training.profile_start_step=3")
    run_steps(build_step_probes(t, run_dir=tmp_path, rank=0, device=CUDA, done_step=0), 4)
    (trace,) = (tmp_path / "profile").glob("rank0.*.pt.trace.json")
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")} == {
        "ProfilerStep#3"}
    assert any(e.get("cat") == "kernel" for e in events)


def test_an_out_of_memory_error_dumps_a_snapshot_first(tmp_path):
    """Last in this file: the out-of-memory observer stays attached to this process."""
    t = cuda_training("training.memory_snapshot_on_oom=true")
    assert build_step_probes(t, run_dir=tmp_path, rank=0, device=CUDA, done_step=0) is None
    free, _ = torch.cuda.mem_get_info()
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(free * 4, dtype=torch.uint8, device=CUDA)
    path = tmp_path / "memory_snapshot" / "rank0_oom.pickle"
    assert path.is_file() and pickle.loads(path.read_bytes())["segments"] is not None
    torch.cuda.memory._record_memory_history(enabled=None)
