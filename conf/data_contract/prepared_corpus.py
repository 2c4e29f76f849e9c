"""A prepared token corpus (`meshrun data prepare`): its manifest, and the pre-launch checks.

A prepared dir holds raw token shards (train_00000.bin, ..., val_00000.bin, ...) and
manifest.json, written LAST (temp name, then rename): a dir without a manifest is unfinished,
and only the shards the manifest lists, at the size it records, are ever read. A shard being
written has a .tmp name and is never listed. `data=files data.prepared=DIR` trains on the train
shards and evaluates on the val shards; the dtype comes from the manifest.
"""
from __future__ import annotations

import json
from pathlib import Path

from conf.errors import ProblemList
from conf.schema import DataConfig, DataKind
from conf.spec import TOKEN_DTYPES
from conf.data_contract.manifest_schema import check_manifest, confined
from conf.data_contract.tokenizer_info import read_tokenizer_info

MANIFEST = "manifest.json"
FORMAT = "meshrun-tokens/1"
"""manifest["format"]: bumped when the layout changes, so an old reader refuses a new dir."""
SPLITS = ("train", "val")
SFT_KIND = "sft"
"""manifest["kind"] of packed chat data with a loss mask (absent: plain token streams)."""


def is_sft(manifest: dict) -> bool:
    return manifest.get("kind") == SFT_KIND


def read_manifest(folder: str | Path) -> dict:
    """The manifest of a prepared dir; ValueError saying what is wrong."""
    path = Path(folder).expanduser() / MANIFEST
    if not Path(folder).expanduser().is_dir():
        raise ValueError("is not a folder")
    if not path.is_file():
        raise ValueError(f"holds no {MANIFEST}: `meshrun data prepare` did not finish there "
                         "(its shards are incomplete)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as err:
        raise ValueError(f"{path} is not readable JSON ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else manifest
        raise ValueError(f"{path} has format {found!r}, this meshrun reads {FORMAT!r}")
    try:
        check_manifest(manifest, folder=path.parent, sft=is_sft(manifest))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return manifest


def shard_paths(folder: str | Path, manifest: dict, split: str, *,
                key: str = "file") -> list[str]:
    """Absolute paths of a split's shards (`key` "mask_file": their loss masks), each confined
    to the prepared dir (see conf/data_contract/manifest_schema.py)."""
    return [str(confined(Path(folder), s[key], key))
            for s in manifest["splits"][split]["shards"]]


def shard_checksums(folder: str | Path, manifest: dict) -> dict[str, str]:
    """Absolute shard path (token and mask files) -> the sha256 the manifest records."""
    out = {}
    for split in SPLITS:
        for shard in manifest["splits"][split]["shards"]:
            for name_key, hash_key in (("file", "sha256"), ("mask_file", "mask_sha256")):
                if name_key in shard:
                    out[str(confined(Path(folder), shard[name_key], name_key))] = shard[hash_key]
    return out


def incomplete_shards(folder: str | Path, manifest: dict) -> list[str]:
    """Listed shards that are missing or not the size the manifest records."""
    item = TOKEN_DTYPES[manifest["dtype"]]
    bad = []
    for split in SPLITS:
        for shard in manifest["splits"][split]["shards"]:
            path = Path(folder).expanduser() / shard["file"]
            if not path.is_file() or path.stat().st_size != shard["tokens"] * item:
                bad.append(shard["file"])
            mask = Path(folder).expanduser() / shard.get("mask_file", "")
            if "mask_file" in shard and (not mask.is_file()
                                         or mask.stat().st_size != shard["tokens"]):
                bad.append(shard["mask_file"])
    return bad


def resolve_prepared(d: DataConfig, *, vocab_size: int, problems: ProblemList,
                     check_paths: bool,
                     seq_len: int | None = None) -> tuple[list[str], list[str], str]:
    """(train shards, val shards, dtype) of data.prepared, adding a problem for each thing that
    would stop or spoil the run: not data=files, also train_files/val_files, no or unfinished
    manifest, a tokenizer bigger than model.vocab_size, data.tokenizer not the one it was made
    with, an SFT dir whose bins are not seq_len+1 tokens."""
    key = "data.prepared"
    if d.sources:
        problems.add("data.sources", list(d.sources), "is given together with data.prepared",
                     "name every dir in data.sources and leave data.prepared empty")
    if d.kind is not DataKind.files:
        problems.add(key, d.prepared, f"needs data=files (data={d.kind.value})", "add data=files")
    if d.train_files or d.val_files:
        problems.add(key, d.prepared, "names the token files itself; data.train_files and "
                     "data.val_files must stay empty", "drop data.train_files/data.val_files")
    if not check_paths and not (Path(d.prepared).expanduser() / MANIFEST).is_file():
        return [], [], d.dtype
    try:
        manifest = read_manifest(d.prepared)
    except ValueError as err:
        problems.add(key, d.prepared, str(err), "run `meshrun data prepare --out "
                     f"{d.prepared} ...` (again: it resumes)")
        return [], [], d.dtype
    bad = incomplete_shards(d.prepared, manifest)
    if bad:
        problems.add(key, d.prepared, f"shards missing or cut short: {', '.join(bad[:3])}",
                     "run the same `meshrun data prepare` again to rebuild them")
    if seq_len is not None and is_sft(manifest) and manifest["bin_tokens"] != seq_len + 1:
        problems.add("training.seq_len", seq_len, f"{d.prepared} is SFT data packed into bins "
                     f"of {manifest['bin_tokens']} tokens; a training window must be one bin",
                     f"set training.seq_len={manifest['bin_tokens'] - 1}, or prepare again "
                     f"with --seq-len {seq_len}")
    tok = manifest["tokenizer"]
    if vocab_size < tok["vocab_size"]:
        problems.add("model.vocab_size", vocab_size, f"below the vocab size "
                     f"{tok['vocab_size']} of the tokenizer {d.prepared} was prepared with",
                     f"set model.vocab_size={tok['vocab_size']} (or larger)")
    if d.tokenizer:
        try:
            info = read_tokenizer_info(d.tokenizer)
        except ValueError:
            pass  # reported by check_tokenizer
        else:
            if info.sha256 != tok["sha256"]:
                problems.add("data.tokenizer", d.tokenizer, f"is not the tokenizer {d.prepared} "
                             f"was prepared with ({tok['path']}, sha256 {tok['sha256'][:12]})",
                             "point data.tokenizer at that one, or prepare again with this one")
    return (shard_paths(d.prepared, manifest, "train"), shard_paths(d.prepared, manifest, "val"),
            manifest["dtype"])


def check_tokenizer(d: DataConfig, *, vocab_size: int, problems: ProblemList) -> None:
    """data.tokenizer: readable, and every id it makes fits model.vocab_size."""
    if not d.tokenizer:
        return
    if d.kind is DataKind.stdlib:
        problems.add("data.tokenizer", d.tokenizer, "data=stdlib is byte-level and takes no "
                     "tokenizer", "tokenize with `meshrun data prepare`, then use data=files "
                     "data.prepared=DIR")
    try:
        info = read_tokenizer_info(d.tokenizer)
    except ValueError as err:
        problems.add("data.tokenizer", d.tokenizer, str(err),
                     "give a tokenizer.json, a tiktoken rank file, or a folder holding one")
        return
    if vocab_size < info.vocab_size:
        problems.add("model.vocab_size", vocab_size, f"below the tokenizer's vocab size "
                     f"{info.vocab_size} ({info.path}): its ids would index past the embedding",
                     f"set model.vocab_size={info.vocab_size} (or larger, e.g. a multiple of 64)")


def resolve_sources(d: DataConfig, *, vocab_size: int, problems: ProblemList,
                    check_paths: bool,
                    seq_len: int | None = None) -> tuple[list[str], list[str], str]:
    """(train shards, val shards, dtype) over all data.sources, each checked as data.prepared
    is; the weights must match them, and the sources must share a tokenizer and dtype."""
    if d.weights and (len(d.weights) != len(d.sources) or min(d.weights) <= 0):
        problems.add("data.weights", list(d.weights), f"needs one positive weight per source "
                     f"({len(d.sources)} sources)", "e.g. data.weights=[0.7,0.3], or leave "
                     "it empty for equal weights")
    train, val, dtypes, tokenizers = [], [], set(), set()
    for source in d.sources:
        found = ProblemList()
        t, v, dtype = resolve_prepared(_one_source(d, source), vocab_size=vocab_size,
                                       problems=found, check_paths=check_paths,
                                       seq_len=seq_len)
        for p in found.items:  # name the key the user wrote
            key = "data.sources" if p.key == "data.prepared" else p.key
            problems.add(key, p.value, p.rule, p.fix)
        train, val = train + t, val + v
        dtypes.add(dtype)
        if (Path(source).expanduser() / MANIFEST).is_file():
            try:
                manifest = read_manifest(source)
                tokenizers.add(manifest["tokenizer"]["sha256"])
            except (ValueError, KeyError, TypeError):
                continue  # reported by resolve_prepared
            if is_sft(manifest):
                problems.add("data.sources", source, "is SFT data (packed bins with a loss "
                             "mask); a mixture takes plain token corpora", "train on one SFT "
                             "dir with data=files data.prepared=DIR")
    if len(tokenizers) > 1 or len(dtypes) > 1:
        problems.add("data.sources", list(d.sources), "were prepared with different "
                     "tokenizers (or token dtypes)", "prepare every source with one tokenizer")
    return train, val, (dtypes.pop() if len(dtypes) == 1 else d.dtype)


def _one_source(d: DataConfig, source: str) -> DataConfig:
    from dataclasses import replace

    return replace(d, prepared=source, sources=[], weights=[])
