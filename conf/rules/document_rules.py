"""data.document_mask: which token ends a document, and the refusal when none is known.

Document masking needs a token id that separates the documents packed into a training
window. Only tokenized corpora have one. The boundary source, in order:
- an SFT dir (`meshrun data prepare-sft`): the separator its manifest records
  (`document_separator_id`): the EOS, or another token when the chat template ends turns with
  EOS (Qwen2.5 `<|im_end|>`, Llama 3 `<|eot_id|>`), so a conversation is one document, not one
  per turn. Refused when no free token was found, or when an older prepare recorded none and
  its conversations hold EOS (re-prepare);
- the EOS of the tokenizer a `meshrun data prepare` corpus was made with (its manifest);
- the EOS of `data.tokenizer`.
Byte-level stdlib text (source files joined by newlines) and synthetic tokens have none, and
raw token files name none unless `data.tokenizer` does.
"""
from __future__ import annotations

from conf.errors import ProblemList
from conf.data_contract.prepared_corpus import is_sft, read_manifest
from conf.schema import DataConfig, DataKind
from conf.data_contract.tokenizer_info import read_tokenizer_info

KEY = "data.document_mask"
FIX = ("use data=files data.prepared=DIR (made by `meshrun data prepare`: documents end with "
       "the tokenizer's EOS), or name a tokenizer with an EOS token in data.tokenizer, "
       "or set data.document_mask=false")


def resolve_document_eos(d: DataConfig, problems: ProblemList) -> int | None:
    """The token id that ends a document when data.document_mask is on (else None); a problem
    when it is on and no separator is known. A broken data.prepared or data.tokenizer is
    reported by its own rule, not again here."""
    if not d.document_mask:
        return None
    if d.kind is not DataKind.files:
        problems.add(KEY, True, f"data={d.kind.value} has no token that ends a document ("
                     + ("byte-level text joined by newlines" if d.kind is DataKind.stdlib
                        else "random tokens") + ")", FIX)
        return None
    if d.prepared:
        manifest = _manifest(d.prepared)
        if manifest is not None and is_sft(manifest):
            return _sft_separator(d.prepared, manifest, problems)
    sources = _eos_sources(d)
    if any(eos is not None for _, eos in sources):
        return next(eos for _, eos in sources if eos is not None)
    if not sources:
        problems.add(KEY, True, "raw token files name no end-of-document token", FIX)
    elif all(where for where, _ in sources):
        problems.add(KEY, True, f"{' and '.join(where for where, _ in sources)}: no EOS token "
                     "known", FIX)
    return None


def _eos_sources(d: DataConfig) -> list[tuple[str, int | None]]:
    """(where, EOS id or None) of data.prepared's manifest and data.tokenizer, those given;
    `where` is empty when the source is unreadable (its own rule reports that)."""
    sources = []
    if d.prepared:
        try:
            tokenizer = read_manifest(d.prepared)["tokenizer"]
            sources.append((f"the tokenizer {d.prepared} was prepared with",
                            tokenizer.get("eos_id")))
        except (ValueError, KeyError, TypeError):
            sources.append(("", None))
    if d.tokenizer:
        try:
            sources.append((f"tokenizer {d.tokenizer}", read_tokenizer_info(d.tokenizer).eos_id))
        except ValueError:
            sources.append(("", None))
    return sources


SEPARATOR = "document_separator_id"
"""The SFT manifest's key naming the token that ends each packed conversation."""


def _manifest(prepared: str) -> dict | None:
    try:
        return read_manifest(prepared)
    except ValueError:
        return None  # its own rule reports an unreadable data.prepared


def _sft_separator(prepared: str, manifest: dict, problems: ProblemList) -> int | None:
    """The separator of packed conversations that an SFT manifest records (see the module
    docstring); a problem when it has none that keeps conversations whole."""
    if SEPARATOR in manifest:
        separator = manifest[SEPARATOR]
        if separator is None:
            problems.add(KEY, True, f"{prepared}: every special token of the tokenizer occurs "
                         "inside its conversations, so no token separates them",
                         "add an unused special token to the tokenizer and run `meshrun data "
                         "prepare-sft` again, or set data.document_mask=false")
        return separator
    inside = manifest.get("eos_inside_conversations", 0)
    if inside:
        problems.add(KEY, True, f"{prepared}: its conversations hold {inside} EOS tokens (the "
                     "chat template ends turns with EOS) and this older prepared dir names no "
                     "other separator, so masking at EOS would cut conversations into turns",
                     "run `meshrun data prepare-sft` again (it records a separator), or set "
                     "data.document_mask=false")
        return None
    return manifest.get("tokenizer", {}).get("eos_id")
