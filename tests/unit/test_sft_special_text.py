"""Issue 25 for `data prepare-sft`: a special token's text inside a message's content stays
text (the template's own markers stay special tokens), with the mask as before;
`--parse-special` turns content text into the token. The tokenizer is a BPE trained here;
tests/unit/test_tiktoken.py checks the tiktoken kind."""
from __future__ import annotations

import json

import numpy as np
import pytest

from launcher.data.hf_tokenizer import load_tokenizer
from launcher.data.sft_prepare import SftOptions, encode_conversation, prepare_sft
from launcher.data.sft_template import ChatTemplate
from tests.support.sft_shards import read_split
from tests.support.text_corpora import trained_tokenizer

EOS_TURNS = ("{% for m in messages %}{{ bos_token + m['role'] + ': ' + m['content'] + eos_token }}"
             "{% endfor %}")
"""Ends every turn with the EOS token (as Llama 3.1's and Qwen2.5's instruct templates do) and
starts it with BOS: the template's own special tokens."""
QUOTING = [{"role": "user", "content": "why does </s> end a text? and <s>"},
           {"role": "assistant", "content": "</s> is the EOS </s> of this <s> tokenizer"},
           {"role": "user", "content": "</s>"},
           {"role": "assistant", "content": " ok </s> "}]
"""User and assistant content quoting the EOS (</s>, 5 times) and BOS (<s>, 2 times)."""


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(trained_tokenizer(tmp_path_factory.mktemp("special_tok")))


def _template(tok) -> ChatTemplate:
    return ChatTemplate(EOS_TURNS, bos_token="<s>", eos_token="</s>", origin="eos-turns")


def test_special_text_in_content_stays_text_and_the_templates_markers_stay_special(tok):
    eos, bos = tok.info.eos_id, tok.info.bos_id
    conv = encode_conversation(QUOTING, tok, _template(tok))
    ids = conv.tokens.tolist()
    assert ids.count(eos) == len(QUOTING) + 1  # one per turn (the template's) + the closing one
    assert ids.count(bos) == len(QUOTING)      # one per turn, none from the content
    assert tok.decode(ids[:-1]) == _template(tok).render(QUOTING)
    parsed = encode_conversation(QUOTING, tok, _template(tok), parse_special=True)
    assert parsed.tokens.tolist().count(eos) == len(QUOTING) + 1 + 5
    assert parsed.tokens.tolist().count(bos) == len(QUOTING) + 2


def test_the_mask_covers_the_assistant_content_and_its_end_marker_only(tok):
    """Learned tokens decode to exactly each assistant content (as written) + its EOS."""
    conv = encode_conversation(QUOTING, tok, _template(tok))
    ids, mask = conv.tokens.tolist(), conv.mask.tolist()
    runs, run = [], []
    for token, bit in zip(ids, mask):
        if bit:
            run.append(token)
        elif run:
            runs.append(run)
            run = []
    assert [tok.decode(r) for r in runs] == [m["content"] + "</s>" for m in QUOTING
                                             if m["role"] == "assistant"]
    assert [r[-1] for r in runs] == [tok.info.eos_id] * 2
    assert [r.count(tok.info.eos_id) for r in runs] == [1, 1]  # content's </s> is text


def test_a_template_that_rewrites_content_is_refused_unless_parse_special(tok):
    shouting = ChatTemplate("{% for m in messages %}{{ m['role'] + ': ' + (m['content'] | upper "
                            "if m['role'] == 'user' else m['content']) + '\\n' }}{% endfor %}",
                            origin="shouting")
    with pytest.raises(ValueError, match="cannot tell message content.*--parse-special"):
        encode_conversation(QUOTING, tok, shouting)
    assert encode_conversation(QUOTING, tok, shouting, parse_special=True).mask.any()


def test_prepare_sft_keeps_content_special_text_as_text(tok, tmp_path):
    """Through the bounded renderer (a child process) and the written shards."""
    folder = tmp_path / "tok"
    folder.mkdir()
    source = tok.info.path
    (folder / "tokenizer.json").write_bytes(open(source, "rb").read())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
         "chat_template": EOS_TURNS}))
    chats = tmp_path / "c.jsonl"
    chats.write_text(json.dumps({"messages": QUOTING}) + "\n")
    counts = {}
    for parse in (False, True):
        out, m, _ = prepare_sft([str(chats)], tokenizer=str(folder),
                                out_dir=str(tmp_path / f"out{parse}"),
                                options=SftOptions(seq_len=255, val_fraction=0,
                                                   parse_special=parse))
        tokens, _ = read_split(out, m, "train")
        counts[parse] = (int(np.sum(tokens == tok.info.eos_id)), m["eos_inside_conversations"])
    assert counts[False] == (len(QUOTING), len(QUOTING))  # separator is pad: EOS occurs inside
    assert counts[True] == (len(QUOTING) + 5, len(QUOTING) + 5)
