"""Which characters of a rendered conversation are message content, and which the template's.

The template's own text (`<|im_start|>`, `<|eot_id|>`, the EOS it writes) is tokenized with
special tokens parsed; message content is tokenized as text, so a user typing `<|eot_id|>` or
`</s>` gets the characters, not the special id (issue 25; `data prepare` does the same for
documents). The content is found by rendering the conversation again with each message's
content replaced by a unique placeholder: the rendering splits into template pieces and
placeholders, and each placeholder stands for the content as the template wrote it (verbatim,
or stripped as `| trim` does). A template that writes content otherwise (or chooses its text by
the content) is refused with a ValueError that names `--parse-special`.
"""
from __future__ import annotations

import re

_MARK = "\u2063meshrun-content-{}\u2063"
_MARK_RE = re.compile("\u2063meshrun-content-(\\d+)\u2063")


def content_spans(render, messages: list[dict], rendered: str,
                  origin: str) -> list[tuple[int, int]]:
    """[start, end) character ranges of `rendered` (= render(messages)) that are message
    content; `render` renders a message list to text."""
    if any(_MARK_RE.search(m["content"]) for m in messages):
        raise ValueError("a message's content holds meshrun's content placeholder")
    probe = render([{**m, "content": _MARK.format(k)} for k, m in enumerate(messages)])
    pieces = _MARK_RE.split(probe)  # template text, message index, template text, ...
    spans, at = [], 0
    for i in range(0, len(pieces), 2):
        if not rendered.startswith(pieces[i], at):
            raise _unsplittable(origin, rendered)
        at += len(pieces[i])
        if i + 1 < len(pieces):
            written = _written(messages[int(pieces[i + 1])]["content"], rendered, at,
                               following=pieces[i + 2], last=i + 3 == len(pieces))
            if written is None:
                raise _unsplittable(origin, rendered)
            spans.append((at, at + len(written)))
            at += len(written)
    if at != len(rendered):
        raise _unsplittable(origin, rendered)
    return spans


def _written(content: str, rendered: str, at: int, *, following: str,
             last: bool) -> str | None:
    """The content as written at `at` (verbatim or stripped), followed by `following`."""
    for form in dict.fromkeys((content, content.strip(), content.lstrip(), content.rstrip())):
        end = at + len(form)
        if rendered.startswith(form, at) and rendered.startswith(following, end) \
                and (not last or end + len(following) == len(rendered)):
            return form
    return None


def _unsplittable(origin: str, rendered: str) -> ValueError:
    return ValueError(f"chat template ({origin}): cannot tell message content from the "
                      f"template's own text in {rendered[:80]!r}... (the template changes the "
                      "content, or writes other text for it); meshrun tokenizes content as text "
                      "and the template's text with special tokens (fix: --parse-special, so "
                      "special-token text inside content becomes the token, too)")


def split_at(segments: list, spans: list[tuple[int, int]], make) -> list:
    """`segments` (with .text, .learned) cut at the span edges; `make(text, learned, content)`
    builds each piece, content=True inside a span. Learned flags are kept character for
    character."""
    out, at = [], 0
    for seg in segments:
        end = at + len(seg.text)
        edges = sorted({at, end} | {p for span in spans for p in span if at < p < end})
        for a, b in zip(edges, edges[1:]):
            inside = any(s <= a and b <= e for s, e in spans)
            out.append(make(seg.text[a - at:b - at], seg.learned, inside))
        at = end
    return out
