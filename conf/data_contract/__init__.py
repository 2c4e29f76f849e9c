"""The data contract, torch-free: what the launcher's `meshrun data` writes and the ranks read,
and the checks resolve() runs on data before launch.

- `stdlib_tokens`: the byte-level stdlib corpus's token dtype and vocabulary.
- `prepared_corpus`: a prepared corpus dir (`meshrun data prepare`/`prepare-sft`): its
  manifest, shards and pre-launch checks.
- `token_files`: raw token files (data=files) checked before launch.
- `tokenizer_info`: what meshrun knows of a tokenizer file, read as plain text.
"""
