"""Rank-side SFT data: packed bins of seq_len+1 tokens with a loss mask (`data prepare-sft`).

Window b of the token shards is bin b (shards hold whole bins and training.seq_len+1 equals the
bin size, checked by resolve() and again here), so no window straddles two bins. Inputs are
bin[:-1]; target j is bin[j+1], kept where mask[j+1] is 1 and IGNORE_INDEX elsewhere, so the loss
covers exactly the assistant tokens the chat template marks. Conversations in a bin end with
the separator the manifest records (`document_separator_id`, never learned), which
data.document_mask takes as the document boundary (conf/rules/document_rules.py), so a conversation
whose template ends turns with EOS stays one document. Order, sharding by dp rank and resume
are those of every training batch stream (training/data/batches.py); validation is the val split's
bins (split by conversation when prepared).
"""
from __future__ import annotations

import numpy as np
import torch

from conf.data_contract.prepared_corpus import read_manifest, shard_checksums, shard_paths
from training.data.batches import MicroBatch, ValBatches, _StepBatches
from training.data.token_windows import ShuffledOrder, TokenDataset, check_token_ids
from training.loss import IGNORE_INDEX


class PackedBins:
    """Bins of one split: tokens and their loss mask, int64 [n, bin_tokens] each."""

    def __init__(self, prepared: str, split: str, *, seq_len: int, vocab_size: int | None):
        manifest = read_manifest(prepared)
        if manifest["bin_tokens"] != seq_len + 1:
            raise ValueError(f"{prepared}: bins of {manifest['bin_tokens']} tokens, but "
                             f"training.seq_len+1 = {seq_len + 1}")
        files = shard_paths(prepared, manifest, split)
        masks = shard_paths(prepared, manifest, split, key="mask_file")
        if not files:
            raise ValueError(f"{prepared}: the {split} split holds no bins (prepare with more "
                             "conversations, or another --val-fraction)")
        checksums = shard_checksums(prepared, manifest)
        self.tokens = TokenDataset(files, dtype=manifest["dtype"], seq_len=seq_len,
                                   checksums=checksums)
        self.mask = TokenDataset(masks, dtype=manifest["mask_dtype"], seq_len=seq_len,
                                 checksums=checksums)
        self.vocab_size = vocab_size
        self.n_bins = self.tokens.n_windows

    def micro_batch(self, indices: np.ndarray) -> MicroBatch:
        tokens = check_token_ids(self.tokens.windows(indices), vocab_size=self.vocab_size,
                                 files=self.tokens.files)
        return masked_micro_batch(tokens, self.mask.windows(indices))


def masked_micro_batch(tokens: np.ndarray, mask: np.ndarray) -> MicroBatch:
    """(inputs, targets): targets are tokens shifted by one, IGNORE_INDEX where the mask of
    the target token is 0."""
    targets = np.where(mask[:, 1:] != 0, tokens[:, 1:], IGNORE_INDEX)
    return (torch.from_numpy(np.ascontiguousarray(tokens[:, :-1])),
            torch.from_numpy(np.ascontiguousarray(targets)))


class SftTrainBatches(_StepBatches):
    """Training micro-batches of packed SFT bins, in the seeded epoch-wise shuffled order."""

    kind = "sft"

    def __init__(self, *, prepared: str, seq_len: int, seed: int, global_batch_size: int,
                 micro_batch_size: int, grad_accum_steps: int, dp_rank: int, dp_size: int,
                 vocab_size: int | None = None):
        super().__init__(seq_len=seq_len, seed=seed, global_batch_size=global_batch_size,
                         micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                         dp_rank=dp_rank, dp_size=dp_size)
        self.bins = PackedBins(prepared, "train", seq_len=seq_len, vocab_size=vocab_size)
        self.order = ShuffledOrder(n_windows=self.bins.n_bins, seed=seed)

    @property
    def epoch(self) -> float:
        return self.position / self.bins.n_bins

    def _micro_batch(self, positions: np.ndarray) -> MicroBatch:
        return self.bins.micro_batch(self.order.window_indices(positions))

    def _samples_per_epoch(self) -> int:
        return self.bins.n_bins


class _SftValBatches(ValBatches):
    def __init__(self, bins: PackedBins, **kwargs):
        super().__init__(samples=None, n_samples=bins.n_bins, **kwargs)
        self._bins = bins

    def _micro_batch(self, positions: np.ndarray) -> MicroBatch:
        return self._bins.micro_batch(positions)


def sft_val_batches(*, prepared: str, seq_len: int, micro_batch_size: int, n_batches: int,
                    dp_rank: int, dp_size: int, vocab_size: int | None = None) -> ValBatches:
    """Validation micro-batches of the val split's bins (unshuffled, sharded by dp rank)."""
    bins = PackedBins(prepared, "val", seq_len=seq_len, vocab_size=vocab_size)
    return _SftValBatches(bins, micro_batch_size=micro_batch_size, n_batches=n_batches,
                          dp_rank=dp_rank, dp_size=dp_size)
