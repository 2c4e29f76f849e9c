"""Data preparation (`meshrun data`, the dry run's corpus): the stdlib corpus, tokenizers,
token shards, SFT chat templates and packing."""
