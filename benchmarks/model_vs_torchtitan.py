"""Forward + backward of the three models alone: torchtitan's, meshrun's and the plain loop's.

No launcher, no optimizer, no data pipeline, no FSDP: each model (torchtitan 0.3.0's llama3
debugmodel as its model registry builds it, meshrun's training.model_builder, the peer's plain_loop.py
Llama) takes the same token batch, computes the mean cross entropy and back-propagates, in one
process, timed alternately round after round. This separates the model's kernels from
everything around them when `vs_torchtitan.py` shows a gap: the default shape is one FSDP
rank's share of that benchmark (debugmodel, seq 2048, 4 sequences, 1 thread).

    python benchmarks/model_vs_torchtitan.py [--threads 1] [--batch 4] [--rounds 6] [--profile]

It needs torchtitan, so it re-runs itself under the peer's Python: venv/ in $PEER_DIR, else in
the peer's setup.sh default. The peer's folder is $MESHRUN_PEER, else shared/peer beside this
repository (benchmarks/peer_paths.py; see the peer's README.md, run its setup.sh first).
--profile adds a torch.profiler table of one step per model (self CPU time by op). Medians over
the rounds after the first (warm-up); ratios within one run only: the machine is shared.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
import types
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.peer_paths import (PEER_DIR_WHERE, PEER_WHERE, peer_dir, peer_python,  # noqa: E402
                                   peer_source)

PEER_SRC = peer_source()
PEER_DIR = peer_dir(PEER_SRC)
DEBUGMODEL = dict(dim=256, n_layers=6, n_heads=16, n_kv_heads=16, ffn_dim=768, vocab_size=2048,
                  rope_theta=500000.0)
TRITON_ONLY = "torchtitan.distributed.minimal_async_ep.kernels"
"""A torchtitan module that imports triton at the top (MoE kernels; dense Llama never calls
it): stubbed, as the peer's tt_cpu.py does, so torchtitan imports on a CPU-only torch."""


def ensure_peer_python() -> None:
    """Re-exec under the peer's Python when torchtitan is not importable here."""
    if importlib.util.find_spec("torchtitan") is not None:
        return
    python = peer_python(PEER_DIR)
    if not python.exists():
        sys.exit(f"torchtitan is not importable and there is no peer venv at {PEER_DIR}: run "
                 f"{PEER_SRC / 'setup.sh'} first (or set PEER_DIR)")
    os.execv(str(python), [str(python), *sys.argv])


def triton_stub() -> types.ModuleType:
    """TRITON_ONLY with every name defined, failing only if it is ever called."""
    stub = types.ModuleType(TRITON_ONLY)

    def missing(name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def fail(*args, **kwargs):
            raise RuntimeError(f"{TRITON_ONLY}.{name} needs triton (stubbed on CPU)")
        return fail

    stub.__getattr__ = missing
    return stub


def torchtitan_model(seq: int, batch: int):
    """torchtitan's debugmodel and the keyword arguments its forward takes (plain causal SDPA
    in place of flex attention, through the peer's CPU patch)."""
    import torch

    if TRITON_ONLY not in sys.modules:
        sys.modules[TRITON_ONLY] = triton_stub()
    os.environ["TT_CPU_ATTN"] = "causal"
    sys.path.insert(0, str(PEER_SRC))
    importlib.import_module("tt_cpu_extra")  # patches FlexAttention for CPU
    from torchtitan.models.llama3 import model_registry

    model = model_registry("debugmodel").model.build()
    if hasattr(model, "init_weights"):
        model.init_weights()
    positions = torch.arange(seq).expand(batch, seq)
    return model, {"attention_masks": model.get_attention_masks(positions)}


def meshrun_model(seq: int):
    import torch

    sys.path.insert(0, str(REPO))
    from conf.spec import ModelSpec
    from training.model_builder import build_model

    spec = ModelSpec(name="tt_debugmodel", **DEBUGMODEL, max_seq_len=seq,
                     tie_embeddings=False, norm_eps=1e-5, init_std=0.02)
    return build_model(spec, device=torch.device("cpu"), seed=0), {}


def plain_model(seq: int, batch: int):
    path = PEER_SRC / "plain_loop.py"
    found = importlib.util.spec_from_file_location("peer_plain_loop", path)
    peer = importlib.util.module_from_spec(found)
    found.loader.exec_module(peer)
    m = DEBUGMODEL
    args = types.SimpleNamespace(dim=m["dim"], n_layers=m["n_layers"], n_heads=m["n_heads"],
                                 n_kv_heads=m["n_kv_heads"], ffn_hidden=m["ffn_dim"],
                                 vocab=m["vocab_size"], seq_len=seq, batch=batch,
                                 rope_theta=m["rope_theta"], naive_norm=False)
    return peer.Llama(args), {}


def step(model, kwargs: dict, tokens) -> float:
    """One forward + backward of the mean next-token cross entropy; the loss."""
    import torch.nn.functional as F

    model.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1], **kwargs)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    return loss.item()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=f"the peer's folder: {PEER_WHERE}; its venv: in "
                                       f"{PEER_DIR_WHERE}")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    ensure_peer_python()
    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    models = {"torchtitan": torchtitan_model(a.seq_len, a.batch),
              "meshrun": meshrun_model(a.seq_len),
              "plain": plain_model(a.seq_len, a.batch)}
    params = {name: sum(t.numel() for t in m.parameters()) for name, (m, _) in models.items()}
    tokens = torch.randint(0, DEBUGMODEL["vocab_size"], (a.batch, a.seq_len + 1))
    times: dict[str, list[float]] = {name: [] for name in models}
    for r in range(a.rounds):
        order = list(models)[r % 3:] + list(models)[:r % 3]
        for name in order:
            model, kwargs = models[name]
            start = time.perf_counter()
            step(model, kwargs, tokens)
            if r:  # round 0 warms up
                times[name].append(time.perf_counter() - start)
    print(f"forward+backward, batch {a.batch} x seq {a.seq_len}, {a.threads} thread(s), "
          f"torch {torch.__version__}, median of {a.rounds - 1} rounds after a warm-up:")
    reference = statistics.median(times["torchtitan"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:10s} {median:7.3f} s  {a.batch * a.seq_len / median:8,.0f} tok/s  "
              f"x{reference / median:.3f} of torchtitan's speed  ({params[name]:,} params; "
              f"rounds {' '.join(f'{v:.2f}' for v in values)})")
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        for name, (model, kwargs) in models.items():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                step(model, kwargs, tokens)
            print(f"\n{name}: one step, self CPU time by op")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
    return 0


if __name__ == "__main__":
    sys.exit(main())
