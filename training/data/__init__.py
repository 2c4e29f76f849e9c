"""Rank-side data: token files read as training windows, batch streams cut by dp rank,
mixtures of prepared dirs and packed SFT conversations.

- `batches`: token files, seeded window order, the train/val/synthetic batch streams and
  `build_train_batches`/`build_val_batches`, which pick the stream a DataSpec asks for.
- `mixture`: samples drawn from several prepared dirs by weight.
- `sft_batches`: packed chat conversations with a loss mask.
"""
