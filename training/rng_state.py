"""A process's random-number states as plain data, saved in each rank's checkpoint file so a
resumed run draws what the uninterrupted one would have."""
from __future__ import annotations

import random

import numpy as np
import torch


def capture_rng_state() -> dict:
    """This process's RNG states (python, numpy, torch CPU, current CUDA device) as plain data."""
    algorithm, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"algorithm": algorithm, "keys": keys.tolist(), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict) -> None:
    """Inverse of `capture_rng_state`."""
    random.setstate(state["python"])
    np_state = state["numpy"]
    np.random.set_state((np_state["algorithm"], np.array(np_state["keys"], dtype=np.uint32),
                         np_state["pos"], np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["torch_cuda"])
