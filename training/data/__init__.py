"""Rank-side data: token files read as training windows, batch streams cut by dp rank,
mixtures of prepared dirs and packed SFT conversations.

- `build`: `build_train_batches`/`build_val_batches`, the streams a DataSpec asks for.
- `token_windows`: memory-mapped token files, windows of seq_len+1 tokens, the seeded order.
- `batches`: the train/val/synthetic batch streams (stepping, dp sharding, resume).
- `mixture`: samples drawn from several prepared dirs by weight.
- `sft_batches`: packed chat conversations with a loss mask.
"""
