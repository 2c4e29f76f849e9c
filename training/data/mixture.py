"""Training samples drawn from several prepared dirs by weight (`data.sources`, `data.weights`).

Global sample g comes from source k with probability w_k: u_g is drawn from (seed, 2, g) and
k is where u_g falls among the cumulative normalised weights, so the choice depends on the
seed and g only, never on the dp degree. Each source keeps a count of the samples taken from it
over all ranks (`taken`); the i-th sample of source k is window i of its seeded epoch-wise
shuffled order (training/data/token_windows.py ShuffledOrder), so a source visits every
window once per epoch of its own. A step draws the sources of the whole global batch (all ranks
do, the same way), advances the counts, and each dp rank keeps its slice; the counts are in the
state dict, so a resume continues the same mixture.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from conf.data_contract.prepared_corpus import read_manifest, shard_checksums, shard_paths
from training.data.batches import (MicroBatch, _StepBatches, rank_micro_batch_positions,
                                   to_micro_batch)
from training.data.token_windows import ShuffledOrder, TokenDataset, check_token_ids

MIX_STREAM = 2
"""Random stream of the source draws (0 and 1 are synthetic train and validation tokens)."""


def draw_sources(positions: np.ndarray, *, weights: Sequence[float], seed: int) -> np.ndarray:
    """Source index of each global sample index in `positions`."""
    cumulative = np.cumsum(np.asarray(weights, dtype=np.float64) / sum(weights))
    u = np.array([np.random.default_rng((seed, MIX_STREAM, int(p))).random() for p in positions])
    return np.minimum(np.searchsorted(cumulative, u, side="right"), len(weights) - 1)


class MixtureBatches(_StepBatches):
    """Training micro-batches mixed from several prepared dirs by weight."""

    kind = "mixture"

    def __init__(self, *, sources: Sequence[str], weights: Sequence[float], seq_len: int,
                 seed: int, global_batch_size: int, micro_batch_size: int,
                 grad_accum_steps: int, dp_rank: int, dp_size: int,
                 vocab_size: int | None = None):
        super().__init__(seq_len=seq_len, seed=seed, global_batch_size=global_batch_size,
                         micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                         dp_rank=dp_rank, dp_size=dp_size)
        self.weights = tuple(weights) or (1.0,) * len(sources)
        self.datasets = [_train_windows(s, seq_len=seq_len) for s in sources]
        self.orders = [ShuffledOrder(n_windows=d.n_windows, seed=seed) for d in self.datasets]
        self.taken = [0] * len(sources)
        """Samples drawn from each source so far, over all dp ranks."""
        self.vocab_size = vocab_size

    def next_step(self) -> list[MicroBatch]:
        step = np.arange(self.position, self.position + self.global_batch_size)
        source = draw_sources(step, weights=self.weights, seed=self.seed)
        index = np.empty_like(step)
        for k in range(len(self.datasets)):  # the i-th draw of source k takes its window i
            mine = source == k
            index[mine] = self.taken[k] + np.arange(int(mine.sum()))
            self.taken[k] += int(mine.sum())
        positions = rank_micro_batch_positions(
            position=0, global_batch_size=self.global_batch_size,
            micro_batch_size=self.micro_batch_size, grad_accum_steps=self.grad_accum_steps,
            dp_rank=self.dp_rank, dp_size=self.dp_size)
        self.position += self.global_batch_size
        return [to_micro_batch(self._windows(source[p], index[p])) for p in positions]

    def _windows(self, sources: np.ndarray, indices: np.ndarray) -> np.ndarray:
        rows = [self.datasets[k].windows(self.orders[k].window_indices(np.array([i])))[0]
                for k, i in zip(sources.tolist(), indices.tolist())]
        return check_token_ids(np.stack(rows), vocab_size=self.vocab_size,
                               files=self.datasets[0].files)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "taken": list(self.taken),
                "weights": list(self.weights)}

    def load_state_dict(self, state: dict) -> None:
        """As every batch stream, plus the per-source counts (the weights must match)."""
        mismatches = [f"{key}: saved {state.get(key)!r}, now {value!r}"
                      for key, value in self.state_dict().items()
                      if key not in ("position", "taken") and state.get(key) != value]
        if mismatches:
            raise ValueError("cannot resume the data mixture (" + "; ".join(mismatches) + "): "
                             "resume with the same sources, weights, seq_len and seed")
        self.position = int(state["position"])
        self.taken = [int(t) for t in state["taken"]]

    def _samples_per_epoch(self) -> list[int]:
        return [d.n_windows for d in self.datasets]


def _train_windows(source: str, *, seq_len: int) -> TokenDataset:
    manifest = read_manifest(source)
    return TokenDataset(shard_paths(source, manifest, "train"), dtype=manifest["dtype"],
                        seq_len=seq_len, checksums=shard_checksums(source, manifest))
