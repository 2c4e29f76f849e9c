"""Batch streams: training samples (token-file windows, training/data/token_windows.py, or
synthetic tokens) in a seeded order, sharded by dp rank and cut into micro-batches; validation
batches fixed across evaluations.

A sample is a non-overlapping window of seq_len+1 tokens over the token files concatenated
logically (input = window[:-1], target = window[1:]). Epoch e visits every window once, in a
permutation drawn from (seed, e). The unit of position is the GLOBAL sample index (samples consumed
by all data-parallel ranks together), so the order, and a resume, do not depend on the dp degree:
a step takes the global batch [position, position + global_batch_size), data-parallel rank r takes
its contiguous slice of global_batch_size/dp samples and cuts it into grad_accum_steps
micro-batches. Ranks that differ only in tp/pp/cp coordinates share a dp rank and get the same data.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from training.data.token_windows import ShuffledOrder, TokenDataset, check_token_ids

MicroBatch = tuple[torch.Tensor, torch.Tensor]
"""(inputs, targets), both int64 [micro_batch_size, seq_len]."""


def rank_micro_batch_positions(*, position: int, global_batch_size: int, micro_batch_size: int,
                               grad_accum_steps: int, dp_rank: int,
                               dp_size: int) -> list[np.ndarray]:
    """Global sample indices of this dp rank's micro-batches for the step starting at `position`."""
    first = position + dp_rank * (global_batch_size // dp_size)
    return [first + i * micro_batch_size + np.arange(micro_batch_size, dtype=np.int64)
            for i in range(grad_accum_steps)]


def check_batch_layout(*, global_batch_size: int, micro_batch_size: int, grad_accum_steps: int,
                       dp_rank: int, dp_size: int) -> None:
    """ValueError unless micro x accumulation x dp == global batch and 0 <= dp_rank < dp_size."""
    if micro_batch_size * grad_accum_steps * dp_size != global_batch_size:
        raise ValueError(f"micro_batch_size({micro_batch_size}) x grad_accum_steps"
                         f"({grad_accum_steps}) x dp({dp_size}) != global_batch_size"
                         f"({global_batch_size})")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank={dp_rank} outside 0..{dp_size - 1}")


def to_micro_batch(windows: np.ndarray) -> MicroBatch:
    tokens = torch.from_numpy(windows)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


class _StepBatches:
    """Stepping, sharding and resume shared by file-backed and synthetic training batches."""

    kind = ""

    def __init__(self, *, seq_len: int, seed: int, global_batch_size: int, micro_batch_size: int,
                 grad_accum_steps: int, dp_rank: int, dp_size: int):
        check_batch_layout(global_batch_size=global_batch_size, micro_batch_size=micro_batch_size,
                           grad_accum_steps=grad_accum_steps, dp_rank=dp_rank, dp_size=dp_size)
        self.seq_len, self.seed = seq_len, seed
        self.global_batch_size = global_batch_size
        self.micro_batch_size, self.grad_accum_steps = micro_batch_size, grad_accum_steps
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.position = 0
        """Global samples consumed so far (by all dp ranks together)."""

    @property
    def tokens_seen(self) -> int:
        """Training tokens consumed by all ranks together (targets, seq_len per sample)."""
        return self.position * self.seq_len

    def next_step(self) -> list[MicroBatch]:
        """This rank's grad_accum_steps micro-batches for the next step; advances the position."""
        positions = rank_micro_batch_positions(
            position=self.position, global_batch_size=self.global_batch_size,
            micro_batch_size=self.micro_batch_size, grad_accum_steps=self.grad_accum_steps,
            dp_rank=self.dp_rank, dp_size=self.dp_size)
        self.position += self.global_batch_size
        return [self._micro_batch(p) for p in positions]

    def state_dict(self) -> dict:
        return {"position": self.position, "kind": self.kind, "seed": self.seed,
                "seq_len": self.seq_len, "samples_per_epoch": self._samples_per_epoch()}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly after the saved step; any dp degree may load any saved state."""
        mismatches = [f"{key}: saved {state.get(key)!r}, now {value!r}"
                      for key, value in self.state_dict().items()
                      if key != "position" and state.get(key) != value]
        if mismatches:
            raise ValueError("cannot resume the data order (" + "; ".join(mismatches) + "): "
                             "resume with the same data, seq_len and seed, or start a new run")
        self.position = int(state["position"])

    def _micro_batch(self, positions: np.ndarray) -> MicroBatch:
        return to_micro_batch(self._samples(positions))

    def _samples(self, positions: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _samples_per_epoch(self) -> int:
        return 0


class TrainBatches(_StepBatches):
    """Training micro-batches from token files, in the seeded epoch-wise shuffled order."""

    kind = "files"

    def __init__(self, *, files: Sequence[str], dtype: str, seq_len: int, seed: int,
                 global_batch_size: int, micro_batch_size: int, grad_accum_steps: int,
                 dp_rank: int, dp_size: int, vocab_size: int | None = None,
                 checksums: dict[str, str] | None = None):
        super().__init__(seq_len=seq_len, seed=seed, global_batch_size=global_batch_size,
                         micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                         dp_rank=dp_rank, dp_size=dp_size)
        self.dataset = TokenDataset(files, dtype=dtype, seq_len=seq_len, checksums=checksums)
        self.order = ShuffledOrder(n_windows=self.dataset.n_windows, seed=seed)
        self.vocab_size = vocab_size

    @property
    def epoch(self) -> float:
        """Fractional epochs completed."""
        return self.position / self.dataset.n_windows

    def _samples(self, positions: np.ndarray) -> np.ndarray:
        windows = self.dataset.windows(self.order.window_indices(positions))
        return check_token_ids(windows, vocab_size=self.vocab_size, files=self.dataset.files)

    def _samples_per_epoch(self) -> int:
        return self.dataset.n_windows


class SyntheticBatches(_StepBatches):
    """Uniform random tokens; sample g is drawn from (seed, stream, g), so it is resumable.

    Nothing to learn: the loss floor is ln(vocab_size). For throughput and plumbing checks.
    """

    kind = "synthetic"

    def __init__(self, *, vocab_size: int, seq_len: int, seed: int, global_batch_size: int,
                 micro_batch_size: int, grad_accum_steps: int, dp_rank: int, dp_size: int):
        super().__init__(seq_len=seq_len, seed=seed, global_batch_size=global_batch_size,
                         micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                         dp_rank=dp_rank, dp_size=dp_size)
        self.vocab_size = vocab_size

    def _samples(self, positions: np.ndarray) -> np.ndarray:
        return synthetic_samples(positions, vocab_size=self.vocab_size, seq_len=self.seq_len,
                                 seed=self.seed, stream=0)


def synthetic_samples(positions: np.ndarray, *, vocab_size: int, seq_len: int, seed: int,
                      stream: int) -> np.ndarray:
    """int64 [len(positions), seq_len+1] of uniform tokens; stream 0 = train, 1 = validation."""
    return np.stack([np.random.default_rng((seed, stream, int(p))).integers(0, vocab_size,
                                                                            seq_len + 1)
                     for p in positions])


class ValBatches:
    """A fixed set of validation micro-batches for one dp rank: the same on every iteration.

    Micro-batch i of dp rank r holds validation samples (i*dp + r)*mb ... +mb, taken in file order
    and wrapped around (cycled) when the validation set is smaller than requested.
    """

    def __init__(self, *, samples: Callable[[np.ndarray], np.ndarray], n_samples: int | None,
                 micro_batch_size: int, n_batches: int, dp_rank: int, dp_size: int):
        self._samples, self._n_samples = samples, n_samples
        self.micro_batch_size, self.n_batches = micro_batch_size, n_batches
        self.dp_rank, self.dp_size = dp_rank, dp_size

    @property
    def n_distinct_samples(self) -> int:
        """Distinct samples one evaluation sees over all dp ranks together."""
        requested = self.n_batches * self.dp_size * self.micro_batch_size
        return requested if self._n_samples is None else min(requested, self._n_samples)

    def __len__(self) -> int:
        return self.n_batches

    def __iter__(self) -> Iterator[MicroBatch]:
        for i in range(self.n_batches):
            first = (i * self.dp_size + self.dp_rank) * self.micro_batch_size
            positions = first + np.arange(self.micro_batch_size, dtype=np.int64)
            if self._n_samples is not None:
                positions %= self._n_samples
            yield self._micro_batch(positions)

    def _micro_batch(self, positions: np.ndarray) -> MicroBatch:
        return to_micro_batch(self._samples(positions))


def val_batches(*, files: Sequence[str], dtype: str, seq_len: int, micro_batch_size: int,
                n_batches: int, dp_rank: int, dp_size: int, vocab_size: int | None = None,
                checksums: dict[str, str] | None = None) -> ValBatches:
    """Validation micro-batches from token files (unshuffled, sharded by dp rank)."""
    dataset = TokenDataset(files, dtype=dtype, seq_len=seq_len, checksums=checksums)
    return ValBatches(
        samples=lambda idx: check_token_ids(dataset.windows(idx), vocab_size=vocab_size,
                                            files=dataset.files),
        n_samples=dataset.n_windows, micro_batch_size=micro_batch_size, n_batches=n_batches,
        dp_rank=dp_rank, dp_size=dp_size)


def synthetic_val_batches(*, vocab_size: int, seq_len: int, seed: int, micro_batch_size: int,
                          n_batches: int, dp_rank: int, dp_size: int) -> ValBatches:
    """Validation micro-batches of random tokens, a stream disjoint from training's."""
    return ValBatches(
        samples=lambda idx: synthetic_samples(idx, vocab_size=vocab_size, seq_len=seq_len,
                                              seed=seed, stream=1),
        n_samples=None, micro_batch_size=micro_batch_size, n_batches=n_batches,
        dp_rank=dp_rank, dp_size=dp_size)
