"""Rank-side peak of one training step: the most bytes of tensor storage alive at once.

torch 2.13 has no CPU allocator statistics or hooks (`torch.cpu` has no memory functions; the
CUDA caching allocator's `max_memory_allocated` has no CPU twin), and the profiler's memory
events are reported per thread (c10's `reportMemoryUsage` looks up the calling thread's
profiler state), so storages that gloo's worker threads release would never be seen freed; the process's
peak RSS (what training.metrics reports on CPU) holds the Python heap and pages glibc keeps,
well above a tiny model's few MB of tensors.
So the step is measured from Python: a TorchDispatchMode sees every op the step runs on this
thread (forward, the autograd engine's backward, FSDP's all-gather and reduce-scatter buffers,
DTensor redistributions, the optimizer's temporaries) and registers each storage it
returns; the storages alive before the step (parameters, buffers, gradients, optimizer
state, the batch) are registered first. After every op that returns a storage, the live
bytes are summed over the registered storages that are still alive, at their current size
(FSDP frees and re-allocates its gathered parameters by resizing storages, outside any op);
with `slack`, only once the bytes made since the last sum pass `slack` x the peak so far (the
peak is then missed by at most that, and summing costs far less).
A storage's Python object lives exactly as long as the storage (PyObject preservation), so a
weak reference to it says whether it is alive.

Not seen: temporaries inside one op (they are freed before it returns) and buffers a
collective allocates in C++ on gloo's own threads.
"""
from __future__ import annotations

import weakref

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _storage(tensor: torch.Tensor) -> torch.UntypedStorage:
    local = tensor._local_tensor if isinstance(tensor, DTensor) else tensor
    return local.untyped_storage()


class LiveBytes(TorchDispatchMode):
    """The peak, over the ops run under it, of bytes in registered storages (docstring)."""

    def __init__(self, tensors=(), *, slack: float = 0.0):
        super().__init__()
        self.live: dict[int, weakref.ref] = {}
        self.peak = 0
        self.ops = 0
        self.peak_at = (0, "start")
        self.slack = slack
        self.unsummed = 0
        for tensor in tensors:
            self.register(tensor)
        self.peak = self.now()

    def register(self, tensor: torch.Tensor) -> int:
        """Track `tensor`'s storage; its bytes if it was not tracked yet, else 0."""
        if tensor.device.type == "meta":
            return 0
        storage = _storage(tensor)
        key = id(storage)
        ref = self.live.get(key)
        if ref is not None and ref() is storage:
            return 0
        self.live[key] = weakref.ref(storage)
        return storage.nbytes()

    def now(self) -> int:
        total, dead = 0, []
        for key, ref in self.live.items():
            storage = ref()
            if storage is None:
                dead.append(key)
            else:
                total += storage.nbytes()
        for key in dead:
            del self.live[key]
        return total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.unsummed += self.register(leaf)
        if kwargs and "out" in kwargs:  # maybe a storage resized up for it (FSDP)
            self.unsummed += sum(t.nbytes for t in tree_leaves(kwargs["out"])
                                 if isinstance(t, torch.Tensor))
        if self.unsummed > self.slack * self.peak:
            self.unsummed, now = 0, self.now()
            if now > self.peak:
                self.peak, self.peak_at = now, (self.ops, str(func))
        return out


def state_tensors(layout, optimizers) -> list[torch.Tensor]:
    """What a rank holds between steps: parameters, buffers, gradients, optimizer state."""
    tensors = []
    for part in layout.parts:
        for param in part.parameters():
            tensors.append(param)
            if param.grad is not None:
                tensors.append(param.grad)
        tensors += list(part.buffers())
    for optimizer in optimizers:
        for state in optimizer.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


def warm_optimizers(layout, optimizers) -> None:
    """Create the optimizer state a step after the first one starts with: one update from
    zero gradients, then the gradients dropped as the loop's `clip_and_step` drops them."""
    for param in layout.parameters():
        param.grad = torch.zeros_like(param)
    for optimizer in optimizers:
        optimizer.step()
    for part in layout.parts:
        part.zero_grad(set_to_none=True)
