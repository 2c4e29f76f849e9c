"""Activation bytes kept for backward per recompute policy, measured on CPU in fp32, against the
plan's formula (parallel/cost/activations.py `activation_bytes`).

    .venv/bin/python benchmarks/recompute_activation_bytes.py [--compile]

measured: storages created in forward and alive after it (tests/unit/test_recompute.py's
`saved_activation_bytes`). plan cpu / plan cuda: the formula for a CPU device and for a GPU
(where offload keeps block activations in host memory). --compile adds what autograd saves
when every block is compiled with inductor (saved-tensor hooks, unique storages), the way the
trainer runs with training.compile=true; offload is not measurable that way (its own hooks
hide the saved tensors from the measuring ones).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from conf.spec import ModelSpec, RecomputeSpec  # noqa: E402
from parallel.cost.activations import activation_bytes  # noqa: E402
from parallel.recompute import apply_recompute  # noqa: E402
from tests.support.specs import cpu_spec  # noqa: E402
from tests.unit.test_recompute import POLICIES, _loss, saved_activation_bytes  # noqa: E402
from training.model import build_model  # noqa: E402

MODELS = {"tiny": (4, 64), "debug": (2, 128)}  # model: (micro batch, seq_len)
BYTES_FP32 = 4


def compiled_saved_bytes(model: torch.nn.Module, batch: torch.Tensor) -> int:
    """Unique storages autograd saves (parameters, buffers and the batch left out)."""
    existing = {t.untyped_storage().data_ptr()
                for t in [*model.parameters(), *model.buffers(), batch]}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in existing:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = _loss(model, batch)
    loss.backward()
    return sum(saved.values())


def measure(model_spec: ModelSpec, recompute: RecomputeSpec, batch: torch.Tensor, *,
            compile: bool) -> tuple[int, int | None]:
    model = build_model(model_spec, device=torch.device("cpu"), seed=0)
    apply_recompute(model, recompute=recompute)
    eager = saved_activation_bytes(model, batch)
    if not compile or recompute.mode.value == "offload":
        return eager, None
    torch._dynamo.reset()
    for block in model.layers.values():
        block.compile()
    compiled_saved_bytes(model, batch)  # compile (and warm up) once
    return eager, compiled_saved_bytes(model, batch)


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
        print(f"| policy | measured | plan cpu | plan cuda | vs none |"
              + (" compiled |" if compile else ""))
        print("|---|---:|---:|---:|---:|" + ("---:|" if compile else ""))
        none = None
        for policy, recompute in POLICIES.items():
            eager, compiled = measure(model_spec, recompute, batch, compile=compile)
            none = eager if none is None else none
            plan = {device: activation_bytes(model_spec, tokens=tokens, recompute=recompute,
                                             dtype_bytes=BYTES_FP32, device_type=device)
                    for device in ("cpu", "cuda")}
            print(f"| {policy} | {kib(eager)} | {kib(plan['cpu'])} | {kib(plan['cuda'])} | "
                  f"{eager / none:.0%} |" + (f" {kib(compiled)} |" if compile else ""))


if __name__ == "__main__":
    main()
