"""Host time a rank spends blocked waiting for collectives, in every layout meshrun builds: the
"wait" of each rank's step split (training/rank_times.py). Installed by the loop for a run.

Where the pinned torch (2.13, torch/distributed/) blocks the host for each layout:
- c10d collectives called synchronously (the loop's loss and gradient-norm all-reduces, the
  token count, ZeRO-1's broadcasts, context parallel's K/V all-gather and its backward
  reduce-scatter): `distributed_c10d` issues the work and calls `Work.wait()` from Python.
- FSDP2 (zero 2/3, HSDP): all-gathers and reduce-scatters via `dist.all_gather_single` and
  `dist.reduce_scatter_single`: the same `Work.wait()` when synchronous (always on CPU), or
  FSDP's own `work.wait()` (`foreach_all_gather_copy_out`) when prefetched asynchronously.
- pipeline schedules: sends and receives from `batch_isend_irecv`, waited by
  `schedules._wait_batch_p2p` with `Work.wait()`.
- DTensor (tensor and sequence parallel, loss parallel): functional collectives, whose results
  (`AsyncCollectiveTensor`) are waited for by `_functional_collectives.wait_tensor` (on
  redistribute, `.wait()` and first use).
- DDP: its reducer waits in C++; its comm hook times the gradient sync (rank_times.py).

torch 2.13 has no hook on these waits for gloo (`ProcessGroup._register_on_completion_hook` is
NCCL-only and times the collective, not the block), so `time_collective_waits` wraps the two
entry points every wait above goes through, process-wide attributes torch looks up at each
call: `Work.wait` and `_functional_collectives.wait_tensor`; the returned function restores
them. Counted: waits on the thread that installed it (the training loop) and inside backward
(autograd's device threads on CUDA), not the checkpoint thread's (its own group). A wait
inside a timed block (`Heartbeat.collective`) counts once. The wrapper costs a few
microseconds per wait (benchmarks/watchdog_cost.py) and touches no tensor: no host sync.

Not seen: collectives compiled into a graph (training.compile with tp: the graph calls the
wait op itself; while Dynamo traces, the wrappers step aside and add no graph break). On
CUDA both waits only order streams, so the host does not block there; a fast rank's wait
then lands in the step's host sync and counts as compute. Status and the summary say so for
such runs (conf/run_dir/stragglers.py `why_wait_is_partial`).
"""
from __future__ import annotations

import threading
from typing import Callable

import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed.distributed_c10d import Work

from training.heartbeat import Heartbeat


def time_collective_waits(heartbeat: Heartbeat) -> Callable[[], None]:
    """Add the host time blocked in every collective wait to `heartbeat.wait_s` from now on;
    returns the function that puts torch's own waits back."""
    owner, thread, in_backward = threading.get_ident(), threading.get_ident, _in_backward
    compiling = torch.compiler.is_compiling
    work_wait, wait_tensor = Work.wait, funcol.wait_tensor

    def timed_work_wait(work, *args, **kwargs):
        if compiling() or (thread() != owner and not in_backward()):
            return work_wait(work, *args, **kwargs)
        return heartbeat.blocked_in(work_wait, work, *args, **kwargs)

    def timed_wait_tensor(tensor):
        if compiling() or (thread() != owner and not in_backward()):
            return wait_tensor(tensor)
        return heartbeat.blocked_in(wait_tensor, tensor)

    Work.wait, funcol.wait_tensor = timed_work_wait, timed_wait_tensor

    def restore() -> None:
        Work.wait, funcol.wait_tensor = work_wait, wait_tensor

    return restore


def _in_backward() -> bool:
    """Inside autograd's backward (its device threads run it on CUDA)."""
    return torch._C._current_graph_task_id() != -1
