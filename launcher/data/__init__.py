"""Data preparation for `meshrun data` and the dry run: the stdlib corpus, tokenizers, token shards, SFT templates and packing."""
