"""The one place tests build specs: real RunSpecs through the compose + resolve path users
take (`cpu_spec` and the presets built on it), and a bare ModelSpec for model-only tests."""
from __future__ import annotations

import functools
from dataclasses import replace

from conf.compose import compose_config
from conf.resolve import resolve
from conf.spec import HostSpec, ModelSpec, RunSpec

CPU_HOST = HostSpec(gpu_name="", gpu_count=0, compute_capability=0.0, cpu_count=2)

# AdamW's first step moves each weight by lr * g / (|g| + eps): where |g| is near eps (1e-8)
# its slope is ~lr / eps, so reduction-order noise of 1e-10 in a gradient becomes lr * 1e-2 in
# the parameter. At lr=3e-3 that is ~7e-6 (seen here), at lr=1e-4 ~3e-7: the parity tests use
# the small LR so the parameter check measures the parallel code, not that amplification.
PARITY_LR = "optim.lr=1e-4"


def cpu_spec(*overrides: str) -> RunSpec:
    """A resolved spec on a CPU host, W&B disabled, from `overrides`."""
    cfg = compose_config(["logging=disabled", *overrides])
    return resolve(cfg, host=CPU_HOST, check_paths=False)


def synthetic_spec(*overrides: str) -> RunSpec:
    """The parity tests' run: the tiny model on synthetic data, 2 ranks, the parity LR."""
    return cpu_spec("model=tiny", "data=synthetic", "training.seq_len=32",
                    "cluster.procs_per_node=2", PARITY_LR, *overrides)


def hf_spec(folder, *extra: str) -> RunSpec:
    """A run that starts from the Hugging Face model saved in `folder` (synthetic data)."""
    return cpu_spec("model=hf", f"model.path={folder}", "data=synthetic", "training.seq_len=40",
                    *extra)


@functools.cache
def _hf_config_composed():
    """Composed once (Hydra costs most of a second here); checked_hf_spec points it at a folder."""
    return compose_config(["logging=disabled", "model=hf", "model.path=PLACEHOLDER",
                           "data=synthetic", "training.seq_len=40"])


def checked_hf_spec(folder, load_from="") -> RunSpec:
    """hf_spec as `meshrun run` resolves it: with the files read (check_paths=True), so the
    folder's safetensors are checked too."""
    cfg = _hf_config_composed()
    cfg = replace(cfg, model=replace(cfg.model, path=str(folder)),
                  checkpoint=replace(cfg.checkpoint, load_from=str(load_from)))
    return resolve(cfg, host=CPU_HOST, check_paths=True)


def tiny_model_spec(**overrides) -> ModelSpec:
    """2 layers, dim 64, 4 query heads sharing 2 key/value heads, byte vocabulary."""
    fields = dict(
        name="tiny", n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=128,
        vocab_size=256, max_seq_len=128, rope_theta=10000.0, tie_embeddings=False,
        norm_eps=1e-5, init_std=0.02,
    )
    fields.update(overrides)
    return ModelSpec(**fields)
