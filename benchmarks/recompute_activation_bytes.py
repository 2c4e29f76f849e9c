"""Activation bytes kept for backward per recompute policy, measured on CPU in fp32, against the
plan's formula (parallel/cost/activations.py `activation_bytes`).

    .venv/bin/python benchmarks/recompute_activation_bytes.py [--compile]

measured: storages created in forward and alive after it (as tests/unit/test_recompute.py's
`saved_activation_bytes` counts them), with the trainer's inputs and loss: contiguous targets
cut from the batch the way training/data/batches.py cuts them, and training.loss's
`token_cross_entropy_sum`. (Slicing the targets out of one [B, T+1] batch inside the loss, as
the unit test's `_loss` does, makes cross entropy keep a flattened int64 copy of them, 8 B a
token that the trainer never holds: the plan rightly leaves it out.) plan cpu / plan cuda: the formula for a CPU device and for a GPU
(where offload keeps block activations in host memory). --compile adds what autograd saves
when every block is compiled with inductor (saved-tensor hooks, unique storages), the way the
trainer runs with training.compile=true; offload is not measurable that way (its own hooks
hide the saved tensors from the measuring ones).
"""
from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch
from torch.multiprocessing.reductions import StorageWeakRef

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conf.spec import ModelSpec, RecomputeSpec  # noqa: E402
from parallel.cost.activations import activation_bytes  # noqa: E402
from parallel.recompute import apply_recompute  # noqa: E402
from tests.support.specs import cpu_spec  # noqa: E402
from tests.support.recompute_storages import POLICIES, NewStorages  # noqa: E402
from training.loss import token_cross_entropy_sum  # noqa: E402
from training.model_builder import build_model  # noqa: E402

MODELS = {"tiny": (4, 64), "debug": (2, 128)}  # model: (micro batch, seq_len)
BYTES_FP32 = 4


def compiled_saved_bytes(model: torch.nn.Module, inputs: torch.Tensor,
                         targets: torch.Tensor) -> int:
    """Unique storages autograd saves (parameters, buffers and the batch left out)."""
    existing = {t.untyped_storage().data_ptr()
                for t in [*model.parameters(), *model.buffers(), inputs, targets]}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in existing:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = token_cross_entropy_sum(model(inputs), targets)
    loss.backward()
    return sum(saved.values())


def kept_bytes(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> int:
    """Bytes of storages made in the trainer's forward and loss, alive for backward."""
    existing = {StorageWeakRef(t.untyped_storage()).cdata
                for t in [*model.parameters(), *model.buffers(), inputs, targets]}
    recorder = NewStorages()
    with recorder:
        loss = token_cross_entropy_sum(model(inputs), targets)
    gc.collect()
    alive = sum(nbytes for key, (ref, nbytes, _) in recorder.storages.items()
                if key not in existing and not ref.expired())
    loss.backward()  # the graph stays alive until counted
    return alive


def measure(model_spec: ModelSpec, recompute: RecomputeSpec, batch: torch.Tensor, *,
            compile: bool) -> tuple[int, int | None]:
    model = build_model(model_spec, device=torch.device("cpu"), seed=0)
    apply_recompute(model, recompute=recompute)
    inputs, targets = batch[:, :-1].contiguous(), batch[:, 1:].contiguous()
    eager = kept_bytes(model, inputs, targets)
    if not compile or recompute.mode.value == "offload":
        return eager, None
    torch._dynamo.reset()
    for block in model.layers.values():
        block.compile()
    compiled_saved_bytes(model, inputs, targets)  # compile (and warm up) once
    return eager, compiled_saved_bytes(model, inputs, targets)


def kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:,.1f}"


def main() -> None:
    compile = "--compile" in sys.argv
    torch.set_num_threads(1)
    for name, (micro_batch, seq_len) in MODELS.items():
        model_spec = cpu_spec(f"model={name}").model
        tokens = micro_batch * seq_len
        batch = torch.randint(0, model_spec.vocab_size, (micro_batch, seq_len + 1),
                              generator=torch.Generator().manual_seed(0))
        print(f"\n{name}: {model_spec.n_layers} layers, dim {model_spec.dim}, ffn "
              f"{model_spec.ffn_dim}, micro batch {micro_batch} x seq {seq_len}, fp32, KiB")
        print("| policy | measured | plan cpu | measured - plan cpu, B | plan cuda | vs none |"
              + (" compiled |" if compile else ""))
        print("|---|---:|---:|---:|---:|---:|" + ("---:|" if compile else ""))
        none = None
        for policy, recompute in POLICIES.items():
            eager, compiled = measure(model_spec, recompute, batch, compile=compile)
            none = eager if none is None else none
            plan = {device: activation_bytes(model_spec, tokens=tokens, recompute=recompute,
                                             dtype_bytes=BYTES_FP32, device_type=device)
                    for device in ("cpu", "cuda")}
            print(f"| {policy} | {kib(eager)} | {kib(plan['cpu'])} | {eager - plan['cpu']} | "
                  f"{kib(plan['cuda'])} | "
                  f"{eager / none:.0%} |" + (f" {kib(compiled)} |" if compile else ""))


if __name__ == "__main__":
    main()
