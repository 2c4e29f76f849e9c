"""Read prepared SFT shards back directly (tokens and loss masks, bins of `bin_tokens`), and the
loss a model should reach on chosen bins, computed by hand from them."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def read_split(out: Path, manifest: dict, split: str):
    """(tokens int64, mask uint8), each [bins, bin_tokens], of one split of a prepared folder."""
    shards = manifest["splits"][split]["shards"]
    bin_tokens = manifest["bin_tokens"]
    tokens = np.concatenate([np.fromfile(out / s["file"], dtype=manifest["dtype"])
                             for s in shards]).reshape(-1, bin_tokens)
    mask = np.concatenate([np.fromfile(out / s["mask_file"], dtype=np.uint8)
                           for s in shards]).reshape(-1, bin_tokens)
    return tokens.astype(np.int64), mask


def hand_loss(model, out: Path, m: dict, bin_ids) -> torch.Tensor:
    """Mean over the learned target tokens of -log p, from the shards read directly."""
    tokens, mask = read_split(out, m, "train")
    tokens, mask = torch.from_numpy(tokens[bin_ids]), torch.from_numpy(mask[bin_ids])
    logp = torch.log_softmax(model(tokens[:, :-1]).float(), dim=-1)
    picked = logp.gather(-1, tokens[:, 1:, None])[..., 0]
    learned = mask[:, 1:].bool()
    return -(picked[learned]).sum() / learned.sum()
