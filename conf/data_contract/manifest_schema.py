"""The schema of a prepared dir's manifest.json: every key a reader uses, its type, and every
shard path confined to the prepared dir.

`check_manifest` runs on every read (the launcher's checks, the ranks, `meshrun data` itself), so
a hand-edited or damaged manifest is refused with the key and the file named, before any shard
is opened: an unknown dtype, a missing section, a wrong type, a shard named `../x.bin`, an
absolute path, or a symlink that leads out of the dir.
"""
from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

from conf.spec import TOKEN_DTYPES

SHA256 = re.compile(r"[0-9a-f]{64}")
MASK_DTYPES = ("uint8",)
"""The loss-mask element type of an SFT dir (one byte per token)."""


def check_manifest(manifest: object, *, folder: Path, sft: bool) -> None:
    """ValueError `KEY=VALUE: RULE` for the first key that breaks the schema."""
    _need(isinstance(manifest, dict), "", manifest, "must be a JSON object")
    _need(manifest.get("dtype") in TOKEN_DTYPES, "dtype", manifest.get("dtype"),
          f"must be one of {', '.join(TOKEN_DTYPES)}")
    tok = manifest.get("tokenizer")
    _need(isinstance(tok, dict), "tokenizer", tok, "must be an object (the tokenizer section)")
    _need(_is_int(tok.get("vocab_size")) and tok["vocab_size"] > 0, "tokenizer.vocab_size",
          tok.get("vocab_size"), "must be a positive integer")
    _need(isinstance(tok.get("sha256"), str), "tokenizer.sha256", tok.get("sha256"),
          "must be a string")
    _need(isinstance(tok.get("path", ""), str), "tokenizer.path", tok.get("path"),
          "must be a string")
    for key in ("bos_id", "eos_id", "pad_id"):
        value = tok.get(key)
        _need(value is None or (_is_int(value) and 0 <= value < tok["vocab_size"]),
              f"tokenizer.{key}", value, "must be a token id below tokenizer.vocab_size, or null")
    splits = manifest.get("splits")
    _need(isinstance(splits, dict), "splits", splits, "must be an object with train and val")
    for split in ("train", "val"):
        _check_split(splits.get(split), f"splits.{split}", folder=folder, sft=sft)
    if sft:
        _check_sft(manifest)


def _check_split(split: object, key: str, *, folder: Path, sft: bool) -> None:
    _need(isinstance(split, dict), key, split, "must be an object (a split section)")
    shards = split.get("shards")
    _need(isinstance(shards, list), f"{key}.shards", shards, "must be a list")
    for i, shard in enumerate(shards):
        at = f"{key}.shards[{i}]"
        _need(isinstance(shard, dict), at, shard, "must be an object")
        _need(_is_int(shard.get("tokens")) and shard["tokens"] >= 0, f"{at}.tokens",
              shard.get("tokens"), "must be a whole number of tokens")
        names = [("file", "sha256")] + ([("mask_file", "mask_sha256")] if sft else [])
        for name_key, hash_key in names:
            confined(folder, shard.get(name_key), f"{at}.{name_key}")
            _need(isinstance(shard.get(hash_key), str) and SHA256.fullmatch(shard[hash_key]),
                  f"{at}.{hash_key}", shard.get(hash_key), "must be a sha256 (64 hex digits)")


def _check_sft(manifest: dict) -> None:
    _need(manifest.get("mask_dtype") in MASK_DTYPES, "mask_dtype", manifest.get("mask_dtype"),
          f"must be one of {', '.join(MASK_DTYPES)}")
    bins = manifest.get("bin_tokens")
    _need(_is_int(bins) and bins >= 2, "bin_tokens", bins, "must be an integer >= 2")
    vocab = manifest["tokenizer"]["vocab_size"]
    for key in ("pad_id", "document_separator_id"):
        value = manifest.get(key)
        _need(value is None or (_is_int(value) and 0 <= value < vocab), key, value,
              "must be a token id below tokenizer.vocab_size, or null")
    for split in ("train", "val"):
        for i, shard in enumerate(manifest["splits"][split]["shards"]):
            _need(shard["tokens"] % bins == 0, f"splits.{split}.shards[{i}].tokens",
                  shard["tokens"], f"must be whole bins of bin_tokens={bins}")


def confined(folder: Path, name: object, key: str) -> Path:
    """folder/name, when `name` is a relative path that stays inside `folder` (also after
    following symlinks); ValueError naming `key` otherwise."""
    _need(isinstance(name, str) and name != "", key, name, "must be a file name")
    pure = PurePosixPath(name)
    _need(not pure.is_absolute() and "\\" not in name and ".." not in pure.parts, key, name,
          "must be a path inside the prepared dir (no absolute path, no `..`)")
    base = Path(folder).expanduser().resolve()
    path = base / pure
    _need(path.resolve().is_relative_to(base), key, name,
          f"leads out of the prepared dir (a symlink to {path.resolve()})")
    return path


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _need(ok: object, key: str, value: object, rule: str) -> None:
    if not ok:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise ValueError(f"{key or '(top level)'}={shown}: {rule}")
