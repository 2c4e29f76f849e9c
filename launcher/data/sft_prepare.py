"""`meshrun data prepare-sft`: chat JSONL -> packed bins of seq_len+1 tokens + a loss mask.

A conversation is one JSONL line holding a list of {"role", "content"} messages (field
--messages-field, default "messages"). It is rendered by the chat template
(launcher/data/sft_template), each segment tokenized on its own (no special tokens added; the
template's own text with special tokens parsed, message content as text, so a message quoting
`</s>` does not end the conversation: launcher/data/sft_content; --parse-special parses content
too), and becomes
    [BOS, only with the default template] segments... EOS
with a mask byte per token: 1 on assistant content + turn end marker, 0 elsewhere (the EOS that
separates conversations included). Conversation i goes to validation when
floor((i+1)*f) > floor(i*f), as in `data prepare`. A conversation longer than a bin is dropped
(--too-long drop, the default) or cut to the bin (--too-long truncate; cut ones with nothing left
to learn are dropped); conversations without an assistant token are dropped; all are counted.
Each split is packed first-fit-decreasing (launcher/data/sft_pack) into bins of seq_len+1 tokens,
padded with the pad id (EOS when the tokenizer has none) under mask 0. Bin b of a split is
window b of its shards: SPLIT_NNNNN.bin (tokens) and SPLIT_NNNNN.mask (uint8), whole bins per
shard. The manifest (conf/data_contract/prepared_corpus.py, kind "sft") records bins, conversations, truncated and
dropped counts, the packing efficiency (real tokens / bin capacity), and how many EOS tokens
sit INSIDE conversations (a template whose turn end is the EOS token, as Qwen2.5's and
Llama 3.1's instruct tokenizers are configured).

Conversations are delimited by a separator token, recorded in the manifest as
`document_separator_id` (conf/rules/document_rules.py makes it the boundary of data.document_mask):
the EOS when no conversation holds one, else the first of the pad, BOS and the tokenizer's other
special tokens that no conversation holds (`choose_separator`), so document masking never cuts
a conversation into turns. The separator is never learned and, under document masking, nothing
attends to it but itself, so which token it is does not change the loss. None is recorded when
every candidate occurs inside a conversation (document masking is then refused).
Shards and manifest are written atomically; a second call with the same inputs and options does
nothing.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from conf.data_contract.prepared_corpus import FORMAT, MANIFEST, SFT_KIND, SPLITS
from launcher.data.document_inputs import expand_inputs
from launcher.data.hf_tokenizer import Tokenizer, load_tokenizer
from launcher.data.sft_pack import first_fit_decreasing, packing_efficiency
from launcher.data.output_dir import check_out_dir, os_problem, prepared_name, staged_dir
from launcher.data.sft_template import ASSISTANT, ChatTemplate, load_chat_template
from launcher.data.template_render import BoundedTemplate
from launcher.data.token_shards import (MAX_SHARD_TOKENS, _fingerprint, _finished, _write_atomic,
                                        token_dtype)

TOO_LONG = ("drop", "truncate")
MASK_DTYPE = "uint8"
LAYOUT = "separator-v2"
"""Part of the fingerprint: bumped when the bins' layout changes, so a dir is re-prepared."""
MAX_SEQ_LEN = 1 << 24
"""--seq-len above this (16 Mi tokens a bin) is refused."""
COMMAND = "data prepare-sft"


@dataclass(frozen=True, kw_only=True)
class SftOptions:
    seq_len: int
    messages_field: str = "messages"
    val_fraction: float = 0.01
    shard_tokens: int = 1 << 26
    too_long: str = "drop"
    bos_token: str = ""
    eos_token: str = ""
    parse_special: bool = False
    """Special-token text inside message content becomes the token (default: it stays text;
    the template's own markers are special tokens either way)."""


@dataclass
class Conversation:
    tokens: np.ndarray
    mask: np.ndarray
    truncated: bool = False
    """Cut to the bin: its last token is content, not the separator."""


@dataclass
class _Split:
    conversations: list[Conversation] = field(default_factory=list)
    truncated: int = 0
    dropped_too_long: int = 0
    dropped_nothing_learned: int = 0
    roles: dict = field(default_factory=dict)
    """role -> messages seen with it (before any filter)."""


def prepare_sft(inputs: list[str], *, tokenizer: str, out_dir: str,
                options: SftOptions) -> tuple[Path, dict, bool]:
    """(out dir, manifest, skipped); ValueError for bad input (named)."""
    _check_options(options)
    tok = load_tokenizer(tokenizer, bos_token=options.bos_token, eos_token=options.eos_token)
    if tok.info.eos_id is None:
        raise ValueError(f"tokenizer {tok.info.path} has no EOS token I recognise (fix: name "
                         "it with --eos-token)")
    template = load_chat_template(tok.info.path, bos_token=_token_text(tok, tok.info.bos_id),
                                  eos_token=_token_text(tok, tok.info.eos_id))
    out = check_out_dir(out_dir, command=COMMAND, own_name=prepared_name)
    files = expand_inputs(inputs, exclude=out)
    fingerprint = _fingerprint(files, tok.info.sha256 + template.source + LAYOUT,
                               options)
    done = _finished(out, fingerprint)
    if done is not None:
        return out, done, True
    splits = _encode_all(files, tok, template, options)
    check_usable(splits, options)
    separator = choose_separator(tok, [c for split in splits.values()
                                       for c in split.conversations])
    if separator is not None:
        _end_with(splits.values(), separator)
    try:
        with staged_dir(out, command=COMMAND) as stage:
            manifest = _write(stage, splits, tok, template, fingerprint, files, options,
                              separator)
    except OSError as err:
        raise os_problem(err, out) from None
    return out, manifest, False


def _encode_all(files: list[Path], tok: Tokenizer, template: ChatTemplate,
                options: SftOptions) -> dict[str, _Split]:
    """Every conversation rendered (bounded: launcher/data/template_render.py), encoded and
    filtered into its split."""
    splits = {s: _Split() for s in SPLITS}
    with BoundedTemplate(template) as bounded:
        for i, (where, messages) in enumerate(_conversations(files, options.messages_field)):
            f = options.val_fraction
            split = splits["val" if int((i + 1) * f) > int(i * f) else "train"]
            for m in messages:
                split.roles[m["role"]] = split.roles.get(m["role"], 0) + 1
            conv = encode_conversation(messages, tok, bounded, where=where,
                                       parse_special=options.parse_special)
            _add(split, conv, options.seq_len + 1, options.too_long)
    return splits


def check_usable(splits: dict[str, _Split], options: SftOptions) -> None:
    """ValueError saying which filter dropped how many when no conversation is left to train
    on (none at all, or none in the train split)."""
    if splits["train"].conversations:
        return
    every = splits.values()
    dropped = {"with no assistant token to learn": sum(s.dropped_nothing_learned for s in every),
               f"longer than a bin of --seq-len+1={options.seq_len + 1} tokens (--too-long "
               "drop)": sum(s.dropped_too_long for s in every)}
    kept = sum(len(s.conversations) for s in every)
    roles: dict[str, int] = {}
    for s in every:
        for role, n in s.roles.items():
            roles[role] = roles.get(role, 0) + n
    total = kept + sum(dropped.values())
    why = "; ".join(f"{n:,} dropped {reason}" for reason, n in dropped.items() if n)
    seen = ", ".join(f"{r!r} ({n:,})" for r, n in sorted(roles.items())) or "none"
    raise ValueError(
        f"no conversation to train on: {total:,} read, {kept:,} usable"
        f"{' (all in the val split: lower --val-fraction)' if kept else ''}"
        f"{'; ' + why if why else ''}. Roles seen: {seen}; only {ASSISTANT!r} turns are learned "
        "(fix: check the role names, give a larger --seq-len or --too-long truncate, or more "
        "conversations); nothing was written")


def _write(out: Path, splits: dict[str, _Split], tok: Tokenizer, template: ChatTemplate,
           fingerprint: str, files: list[Path], options: SftOptions,
           separator: int | None) -> dict:
    """Shards, masks and the manifest (last) into `out`; the manifest."""
    bin_tokens = options.seq_len + 1
    dtype = token_dtype(tok.vocab_size)
    pad_id = tok.info.pad_id if tok.info.pad_id is not None else tok.info.eos_id
    bins_per_shard = max(1, options.shard_tokens // bin_tokens)
    manifest = {
        "format": FORMAT, "kind": SFT_KIND, "fingerprint": fingerprint, "dtype": dtype,
        "mask_dtype": MASK_DTYPE, "bin_tokens": bin_tokens, "seq_len": options.seq_len,
        "chat_template": template.origin, "pad_id": pad_id,
        "document_separator_id": separator,
        "document_separator": _token_text(tok, separator),
        "tokenizer": {k: getattr(tok.info, k) for k in
                      ("path", "sha256", "vocab_size", "bos_id", "eos_id", "pad_id")},
        "inputs": [{"path": str(f.resolve()), "bytes": f.stat().st_size} for f in files],
        "options": asdict(options),
        "splits": {name: _write_split(out, name, split, bin_tokens=bin_tokens, dtype=dtype,
                                      pad_id=pad_id, eos_id=tok.info.eos_id,
                                      bins_per_shard=bins_per_shard)
                   for name, split in splits.items()},
    }
    _totals(manifest)
    manifest["roles"] = {r: sum(s.roles.get(r, 0) for s in splits.values())
                         for r in sorted({r for s in splits.values() for r in s.roles})}
    _write_atomic(out / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    return manifest


def encode_conversation(messages: list[dict], tok: Tokenizer, template, where: str = "", *,
                        parse_special: bool = False) -> Conversation:
    """Tokens and loss mask of one conversation, closed by the EOS (mask 0); `prepare_sft`
    swaps that EOS for another separator when conversations hold EOS inside. `template`: a
    ChatTemplate, or a BoundedTemplate (which names `where` in its errors). The template's text
    is tokenized with special tokens parsed, message content as text unless `parse_special`."""
    mark = not parse_special
    segments = template.segments(messages, where, mark_content=mark) if where \
        else template.segments(messages, mark_content=mark)
    encoded = _encode_segments(tok, segments)
    head = [tok.info.bos_id] if template.origin == "default" and tok.info.bos_id is not None \
        else []
    tokens = head + [t for ids in encoded for t in ids] + [tok.info.eos_id]
    mask = [0] * len(head) + [int(s.learned) for s, ids in zip(segments, encoded) for _ in ids]
    return Conversation(np.array(tokens, dtype=np.int64), np.array(mask + [0], dtype=np.uint8))


def _encode_segments(tok: Tokenizer, segments: list) -> list[list[int]]:
    """Each segment's ids: content as text, the template's text with special tokens parsed."""
    content = [i for i, s in enumerate(segments) if s.content]
    markup = [i for i, s in enumerate(segments) if not s.content]
    ids: list[list[int]] = [[] for _ in segments]
    for indices, special in ((content, False), (markup, True)):
        for i, encoded in zip(indices, tok.encode_batch([segments[i].text for i in indices],
                                                         special_text=special)):
            ids[i] = encoded
    return ids


def _add(split: _Split, conv: Conversation, bin_tokens: int, too_long: str) -> None:
    if len(conv.tokens) > bin_tokens:
        if too_long == "drop":
            split.dropped_too_long += 1
            return
        conv = Conversation(conv.tokens[:bin_tokens], conv.mask[:bin_tokens], truncated=True)
        split.truncated += 1
    if not conv.mask.any():
        split.dropped_nothing_learned += 1
        return
    split.conversations.append(conv)


def choose_separator(tok: Tokenizer, conversations: list[Conversation]) -> int | None:
    """The token that ends each conversation: the EOS when no conversation holds one inside,
    else the first of pad, BOS and the tokenizer's other special tokens (by id) that none
    holds; None when every candidate occurs inside a conversation."""
    used = np.unique(np.concatenate([_inside(c) for c in conversations])) if conversations \
        else np.empty(0, dtype=np.int64)
    info = tok.info
    candidates = [info.eos_id, info.pad_id, info.bos_id] + tok.special_ids()
    for token in candidates:
        if token is not None and token < tok.vocab_size and not np.isin(token, used):
            return token
    return None


def _inside(conv: Conversation) -> np.ndarray:
    """The conversation's tokens without its closing separator."""
    return conv.tokens if conv.truncated else conv.tokens[:-1]


def _end_with(splits, separator: int) -> None:
    """Close every (not truncated) conversation with `separator` instead of the EOS."""
    for split in splits:
        for conv in split.conversations:
            if not conv.truncated:
                conv.tokens[-1] = separator


def _write_split(out: Path, name: str, split: _Split, *, bin_tokens: int, dtype: str,
                 pad_id: int, eos_id: int, bins_per_shard: int) -> dict:
    sizes = [len(c.tokens) for c in split.conversations]
    bins = first_fit_decreasing(sizes, bin_tokens) if sizes else []
    shards = []
    for first in range(0, len(bins), bins_per_shard):
        tokens = np.full((min(bins_per_shard, len(bins) - first), bin_tokens), pad_id,
                         dtype=dtype)
        mask = np.zeros(tokens.shape, dtype=MASK_DTYPE)
        for row, members in enumerate(bins[first:first + bins_per_shard]):
            at = 0
            for i in members:
                conv = split.conversations[i]
                tokens[row, at:at + len(conv.tokens)] = conv.tokens
                mask[row, at:at + len(conv.tokens)] = conv.mask
                at += len(conv.tokens)
        shards.append(_write_shard(out, f"{name}_{len(shards):05d}", tokens, mask))
    return {"conversations": len(sizes), "bins": len(bins), "tokens": len(bins) * bin_tokens,
            "real_tokens": sum(sizes),
            "learned_tokens": int(sum(int(c.mask.sum()) for c in split.conversations)),
            "truncated": split.truncated, "dropped_too_long": split.dropped_too_long,
            "dropped_nothing_learned": split.dropped_nothing_learned,
            "eos_inside_conversations": sum(int((_inside(c) == eos_id).sum())
                                            for c in split.conversations),
            "packing_efficiency": packing_efficiency(sizes, n_bins=len(bins),
                                                     capacity=bin_tokens),
            "shards": shards}


def _write_shard(out: Path, stem: str, tokens: np.ndarray, mask: np.ndarray) -> dict:
    data, mask_data = tokens.tobytes(), mask.tobytes()
    _write_atomic(out / f"{stem}.bin", data)
    _write_atomic(out / f"{stem}.mask", mask_data)
    return {"file": f"{stem}.bin", "mask_file": f"{stem}.mask", "tokens": int(tokens.size),
            "bins": int(tokens.shape[0]), "sha256": hashlib.sha256(data).hexdigest(),
            "mask_sha256": hashlib.sha256(mask_data).hexdigest()}


def _totals(manifest: dict) -> None:
    splits = manifest["splits"].values()
    for key in ("conversations", "bins", "tokens", "real_tokens", "learned_tokens",
                "truncated", "dropped_too_long", "dropped_nothing_learned",
                "eos_inside_conversations"):
        manifest[key] = sum(s[key] for s in splits)
    manifest["documents"] = manifest["conversations"]
    manifest["packing_efficiency"] = manifest["real_tokens"] / max(manifest["tokens"], 1)


def _conversations(files: list[Path], messages_field: str) -> Iterator[tuple[str, list[dict]]]:
    """(file:line, messages) of every non-empty line."""
    seen = False
    for path in files:
        with path.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    seen = True
                    yield f"{path}:{number}", _messages(line, messages_field, f"{path}:{number}")
    if not seen:
        raise ValueError(f"no conversations: {len(files)} input file(s) ({files[0]}, ...) hold "
                         "no non-empty line (fix: give chat JSONL, one conversation a line); "
                         "nothing was written")


def _messages(line: str, messages_field: str, where: str) -> list[dict]:
    try:
        record = json.loads(line)
    except ValueError as err:
        raise ValueError(f"{where}: not a JSON line ({err})") from None
    messages = record.get(messages_field) if isinstance(record, dict) else None
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: no non-empty list field {messages_field!r} (fix: "
                         "--messages-field NAME)")
    for m in messages:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)):
            raise ValueError(f"{where}: a message is not {{\"role\": str, \"content\": str}}: "
                             f"{str(m)[:80]}")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _check_options(options: SftOptions) -> None:
    if not 1 <= options.seq_len <= MAX_SEQ_LEN:
        raise ValueError(f"--seq-len={options.seq_len}: must be in 1..{MAX_SEQ_LEN} (the "
                         "training.seq_len you will train with; bins hold seq_len+1 tokens)")
    if not 1 <= options.shard_tokens <= MAX_SHARD_TOKENS:
        raise ValueError(f"--shard-tokens={options.shard_tokens}: must be in "
                         f"1..{MAX_SHARD_TOKENS}")
    if not 0 <= options.val_fraction < 1:
        raise ValueError(f"--val-fraction={options.val_fraction}: must be in [0, 1)")
    if options.too_long not in TOO_LONG:
        raise ValueError(f"--too-long={options.too_long}: must be one of {', '.join(TOO_LONG)}")


def _token_text(tok: Tokenizer, token_id: int | None) -> str:
    return "" if token_id is None else tok.token_text(token_id)
