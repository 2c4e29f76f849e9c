"""Chat conversations -> text segments marked learned or not, by a chat template (jinja2).

The template is the tokenizer's own (`chat_template` in the tokenizer_config.json beside its
tokenizer.json) or, without one, DEFAULT_CHAT_TEMPLATE:

    <|user|>\\n{content}<|end|>\\n<|assistant|>\\n{content}<|end|>\\n ...

Turns are found by rendering the conversation's first k and k+1 messages: the difference is
turn k's text (a template whose renderings are not prefixes of each other is refused). In an
assistant turn, the learned span is the message content (as the template wrote it) plus the
turn's end marker (what follows the content, trailing whitespace excluded); the turn's header,
every other role's turn and the whitespace after an end marker are not learned.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}")
"""Used when the tokenizer has no chat template. `<|end|>` closes every turn; it is NOT the
EOS token, which separates packed conversations (document masking splits at EOS)."""
ASSISTANT = "assistant"


@dataclass(frozen=True, slots=True)
class Segment:
    text: str
    learned: bool


class ChatTemplate:
    """A compiled chat template and the special-token strings it may use."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 origin: str = "default"):
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        try:
            self._template = env.from_string(source)
        except TemplateError as err:
            raise ValueError(f"chat template ({origin}) does not compile: {err}") from None
        self.source, self.origin = source, origin
        self.bos_token, self.eos_token = bos_token, eos_token

    def render(self, messages: list[dict]) -> str:
        from jinja2 import TemplateError

        try:
            return self._template.render(messages=messages, bos_token=self.bos_token,
                                         eos_token=self.eos_token, add_generation_prompt=False)
        except TemplateError as err:
            raise ValueError(f"chat template ({self.origin}) failed: {err}") from None

    def segments(self, messages: list[dict]) -> list[Segment]:
        """The rendered conversation cut into learned / not-learned segments (see the module
        docstring); ValueError when the template cannot be split into turns."""
        out: list[Segment] = []
        before = self._render_prefix([])
        if before:
            out.append(Segment(before, False))
        for k, message in enumerate(messages):
            after = self._render_prefix(messages[:k + 1])
            if not after.startswith(before):
                raise ValueError(f"chat template ({self.origin}): rendering the first {k + 1} "
                                 "messages does not extend the rendering of the first "
                                 f"{k}; meshrun cannot find turn {k}'s text")
            turn = after[len(before):]
            if message["role"] == ASSISTANT:
                out += self._assistant_turn(messages[:k], turn, message["content"])
            else:
                out.append(Segment(turn, False))
            before = after
        return [s for s in out if s.text]

    def _render_prefix(self, messages: list[dict]) -> str:
        if messages:
            return self.render(messages)
        try:  # some templates index messages[0]; an empty conversation renders as nothing
            return self.render(messages)
        except (ValueError, TypeError, LookupError):
            return ""

    def _assistant_turn(self, earlier: list[dict], turn: str, content: str) -> list[Segment]:
        """header (not learned), content + end marker (learned), trailing whitespace (not).
        Header and end marker come from rendering the same turn with a sentinel content."""
        probe = self._render_prefix(earlier + [{"role": ASSISTANT, "content": _SENTINEL}])
        probe_turn = probe[len(self._render_prefix(earlier)):]
        header, found, end_marker = probe_turn.partition(_SENTINEL)
        written = turn[len(header):len(turn) - len(end_marker)]
        if not found or not turn.startswith(header) or not turn.endswith(end_marker) \
                or written.strip() != content.strip():
            raise ValueError(f"chat template ({self.origin}): cannot find the content "
                             f"{content[:40]!r} of an assistant turn in its rendering {turn!r}")
        kept = end_marker.rstrip()
        return [Segment(header, False), Segment(written + kept, True),
                Segment(end_marker[len(kept):], False)]


_SENTINEL = "\u2063meshrun-assistant-content\u2063"
"""Stands in for an assistant message's content to find the template's turn header and end."""


def _raise(message: str):
    from jinja2 import TemplateError

    raise TemplateError(message)


def load_chat_template(tokenizer_json: str | Path, *, bos_token: str = "",
                       eos_token: str = "") -> ChatTemplate:
    """The tokenizer's chat template (tokenizer_config.json `chat_template`, a string or the
    named list transformers writes, taking "default"), else DEFAULT_CHAT_TEMPLATE."""
    config_path = Path(tokenizer_json).parent / "tokenizer_config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError):
        config = {}
    source = config.get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if isinstance(source, str) and source:
        return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token,
                            origin=str(config_path))
    return ChatTemplate(DEFAULT_CHAT_TEMPLATE, bos_token=bos_token, eos_token=eos_token)
