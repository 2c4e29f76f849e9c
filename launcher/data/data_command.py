"""`meshrun data ...`: train a tokenizer on local text; tokenize inputs into prepared shards.

  meshrun data train-tokenizer --vocab-size 8192 --out tok/ corpus/*.txt
  meshrun data prepare --tokenizer tok/ --out prepared/ corpus/ notes.jsonl
  meshrun run data=files data.prepared=prepared/ model.vocab_size=8192 ...
  meshrun data prepare-sft --tokenizer tok/ --seq-len 2048 --out sft/ chats.jsonl
  meshrun run data=files data.prepared=sft/ training.seq_len=2048 data.document_mask=true ...
"""
from __future__ import annotations

import argparse
import sys

from rich.console import Console

EXIT_BAD_INPUT = 2
KNOWN_ROLES = frozenset({"system", "user", "assistant", "tool", "ipython", "developer",
                         "function"})
"""Roles chat templates know; another one is reported (a misspelt "asistant" is never learned)."""


def register(sub) -> None:
    """Add the `data` subcommand to the `meshrun` subparsers."""
    data = sub.add_parser("data", help="tokenizers and tokenized corpora (train-tokenizer, "
                          "prepare, prepare-sft)")
    verbs = data.add_subparsers(dest="data_command", required=True)
    train = verbs.add_parser("train-tokenizer", help="train a byte-level BPE on local text files")
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument("--out", required=True, help="folder for tokenizer.json")
    train.add_argument("--min-frequency", type=int, default=2)
    train.add_argument("files", nargs="+")
    train.set_defaults(handler=train_tokenizer)
    prep = verbs.add_parser("prepare", help="tokenize text/JSONL/Parquet into token shards")
    prep.add_argument("--tokenizer", required=True,
                      help="tokenizer.json, a tiktoken rank file (*.tiktoken, Llama 3 "
                           "tokenizer.model), or a folder holding one")
    prep.add_argument("--out", required=True, help="prepared dir (shards + manifest.json)")
    prep.add_argument("--text-field", default="text", help="JSONL: the field holding the text")
    prep.add_argument("--column", default="text", help="Parquet: the column holding the text")
    prep.add_argument("--val-fraction", type=float, default=0.01,
                      help="share of documents (deterministic, by position) for validation")
    prep.add_argument("--shard-tokens", type=int, default=1 << 28, help="tokens per shard")
    prep.add_argument("--workers", type=int, default=0, help="processes (0 = CPU count)")
    prep.add_argument("--bos-token", default="", help="name the BOS token (default: detected)")
    prep.add_argument("--eos-token", default="", help="name the EOS token (default: detected)")
    prep.add_argument("--parse-special", action="store_true",
                      help="a special token's text inside a document (e.g. '</s>') becomes "
                           "that token; by default it stays text, with either tokenizer kind")
    prep.add_argument("inputs", nargs="+", help="text files (one document each), .jsonl, "
                      ".parquet, or folders of them")
    prep.set_defaults(handler=prepare)
    _register_sft(verbs)


def _register_sft(verbs) -> None:
    sft = verbs.add_parser(
        "prepare-sft", help="chat JSONL -> packed bins of seq_len+1 tokens + a loss mask",
        description="Render each conversation with the tokenizer's chat template "
        "(tokenizer_config.json chat_template; else meshrun's default: "
        "<|role|>\\n{content}<|end|>\\n per message), learn only assistant content + its "
        "turn end, end each conversation with EOS, and pack conversations first-fit-decreasing "
        "into bins of seq_len+1 tokens (padding masked). Train with data=files data.prepared=OUT "
        "training.seq_len=SEQ_LEN (add data.document_mask=true so packed conversations do "
        "not see each other).")
    sft.add_argument("--tokenizer", required=True, help="tokenizer.json or a folder holding one")
    sft.add_argument("--out", required=True, help="prepared dir (shards, masks, manifest.json)")
    sft.add_argument("--seq-len", type=int, required=True,
                     help="the training.seq_len you will train with (bins hold seq_len+1)")
    sft.add_argument("--messages-field", default="messages",
                     help="JSONL: the field holding the list of {role, content} messages")
    sft.add_argument("--val-fraction", type=float, default=0.01,
                     help="share of conversations (deterministic, by position) for validation")
    sft.add_argument("--too-long", choices=("drop", "truncate"), default="drop",
                     help="a conversation longer than a bin: drop it (default) or cut it")
    sft.add_argument("--shard-tokens", type=int, default=1 << 26,
                     help="tokens per shard (rounded down to whole bins)")
    sft.add_argument("--bos-token", default="", help="name the BOS token (default: detected)")
    sft.add_argument("--eos-token", default="", help="name the EOS token (default: detected)")
    sft.add_argument("--parse-special", action="store_true",
                     help="a special token's text inside a message (e.g. '<|eot_id|>') becomes "
                          "that token; by default it stays text (the template's own markers "
                          "are special tokens either way)")
    sft.add_argument("inputs", nargs="+", help=".jsonl files, or folders of them")
    sft.set_defaults(handler=prepare_sft)


def train_tokenizer(args: argparse.Namespace, console: Console) -> int:
    from launcher.data.hf_tokenizer import load_tokenizer, train_bpe

    try:
        path = train_bpe(args.files, vocab_size=args.vocab_size, out_dir=args.out,
                         min_frequency=args.min_frequency)
        info = load_tokenizer(path).info
    except (ValueError, OSError) as err:
        return _bad_input(err)
    console.print(f"wrote {path}: vocab size {info.vocab_size}, bos id {info.bos_id}, "
                  f"eos id {info.eos_id}, pad id {info.pad_id}", markup=False, highlight=False)
    return 0


def prepare(args: argparse.Namespace, console: Console) -> int:
    from launcher.data.token_shards import PrepareOptions, prepare as run_prepare

    options = PrepareOptions(text_field=args.text_field, column=args.column,
                             val_fraction=args.val_fraction, shard_tokens=args.shard_tokens,
                             bos_token=args.bos_token, eos_token=args.eos_token,
                             parse_special=args.parse_special)
    try:
        result = run_prepare(args.inputs, tokenizer=args.tokenizer, out_dir=args.out,
                             options=options, workers=args.workers,
                             progress=sys.stderr if sys.stderr.isatty() else None)
    except (ValueError, OSError) as err:
        return _bad_input(err)
    m = result.manifest
    verb = "up to date (same inputs, tokenizer and options): nothing to do" if result.skipped \
        else "prepared"
    lines = [f"{result.out_dir}: {verb}",
             f"  {m['documents']:,} documents, {m['tokens']:,} tokens, {m['dtype']}, tokenizer "
             f"vocab {m['tokenizer']['vocab_size']} (sha256 {m['tokenizer']['sha256'][:12]})"]
    for split in ("train", "val"):
        s = m["splits"][split]
        lines.append(f"  {split}: {s['documents']:,} documents, {s['tokens']:,} tokens, "
                     f"{len(s['shards'])} shard(s)")
    lines.append(f"  train with: data=files data.prepared={result.out_dir} "
                 f"model.vocab_size={m['tokenizer']['vocab_size']} (or larger)")
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    return 0


def prepare_sft(args: argparse.Namespace, console: Console) -> int:
    from launcher.data.sft_prepare import SftOptions, prepare_sft as run_prepare_sft

    options = SftOptions(seq_len=args.seq_len, messages_field=args.messages_field,
                         val_fraction=args.val_fraction, shard_tokens=args.shard_tokens,
                         too_long=args.too_long, bos_token=args.bos_token,
                         eos_token=args.eos_token, parse_special=args.parse_special)
    try:
        out, m, skipped = run_prepare_sft(args.inputs, tokenizer=args.tokenizer,
                                          out_dir=args.out, options=options)
    except (ValueError, OSError) as err:
        return _bad_input(err)
    verb = "up to date (same inputs, tokenizer and options): nothing to do" if skipped \
        else "prepared"
    lines = [f"{out}: {verb} (SFT, chat template: {m['chat_template']})"]
    for split in ("train", "val"):
        s = m["splits"][split]
        lines.append(f"  {split}: {s['conversations']:,} conversations in {s['bins']:,} bins of "
                     f"{m['bin_tokens']} tokens, {s['learned_tokens']:,} learned tokens, "
                     f"packing efficiency {s['packing_efficiency']:.1%}")
    unknown = sorted(set(m.get("roles", {})) - KNOWN_ROLES)
    if unknown:
        lines.append(f"  warning: roles {', '.join(map(repr, unknown))} are none of "
                     f"{', '.join(sorted(KNOWN_ROLES))}; only 'assistant' turns are learned")
    lines.append(f"  too long for a bin: {m['dropped_too_long']:,} dropped, "
                 f"{m['truncated']:,} truncated; {m['dropped_nothing_learned']:,} dropped "
                 "with no assistant token")
    if m["eos_inside_conversations"]:
        separator = m["document_separator_id"]
        lines.append(f"  {m['eos_inside_conversations']:,} EOS tokens inside conversations (the "
                     "chat template ends turns with EOS): "
                     + (f"conversations end with {m['document_separator']!r} (id {separator}) "
                        "instead, so data.document_mask=true keeps each conversation whole"
                        if separator is not None else
                        "warning: every special token occurs inside conversations, so none "
                        "separates them and data.document_mask=true will be refused"))
    lines.append(f"  packing efficiency (real tokens / bin capacity): "
                 f"{m['packing_efficiency']:.1%}")
    lines.append(f"  train with: data=files data.prepared={out} training.seq_len={m['seq_len']} "
                 f"model.vocab_size={m['tokenizer']['vocab_size']} (or larger)")
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    return 0


def _bad_input(err: Exception) -> int:
    """The one line (or lines) of a refusal on stderr; exit 2. An OSError that no step named
    (a folder that vanished, a permission) is said as the OS says it, with its path."""
    if isinstance(err, OSError) and not isinstance(err, ValueError):
        err = f"cannot use {err.filename or 'a file'}: {err.strerror or err}"
    Console(stderr=True).print(f"meshrun data: {err}", markup=False, highlight=False,
                               soft_wrap=True)
    return EXIT_BAD_INPUT
