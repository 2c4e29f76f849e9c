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

from launcher.data.sft_content import content_spans, split_at

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
    content: bool = False
    """Message content (tokenized as text); else the template's own text (special tokens
    parsed). See launcher/data/sft_content.py."""


MAX_RENDER_CHARS = 1 << 24
"""A rendering longer than this many characters (16 Mi) is stopped: a template's loop, not a chat."""


class ChatTemplate:
    """A compiled chat template and the special-token strings it may use. Rendering runs in
    jinja2's immutable sandbox and stops (ValueError) past `max_chars` characters; the time
    bound is launcher/data/template_render.py's (it renders in a child process)."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "",
                 origin: str = "default", max_chars: int = MAX_RENDER_CHARS):
        self.source, self.origin, self.max_chars = source, origin, max_chars
        self.bos_token, self.eos_token = bos_token, eos_token
        self._compiled = None

    def compiled(self):
        """The jinja2 template, compiled on first use: compiling folds constants (`'x' * 10**10`
        would be built then), so only the bounded renderer's child process compiles a
        tokenizer's template (launcher/data/template_render.py)."""
        if self._compiled is None:
            from jinja2 import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            try:
                self._compiled = env.from_string(self.source)
            except TemplateError as err:
                raise ValueError(f"chat template ({self.origin}) does not compile: {err}") \
                    from None
            except Exception as err:  # a constant folded at compile time (MemoryError, ...)
                raise ValueError(f"chat template ({self.origin}) does not compile: "
                                 f"{type(err).__name__}: {str(err)[:200]}") from None
        return self._compiled

    def render(self, messages: list[dict]) -> str:
        from jinja2 import TemplateError

        parts, size = [], 0
        template = self.compiled()
        try:
            for part in template.generate(messages=messages, bos_token=self.bos_token,
                                                eos_token=self.eos_token,
                                                add_generation_prompt=False):
                parts.append(part)
                size += len(part)
                if size > self.max_chars:
                    raise ValueError(f"chat template ({self.origin}) rendered over "
                                     f"{self.max_chars:,} characters for one conversation: a "
                                     "loop in the template, not a chat (fix: correct the "
                                     "template)")
        except TemplateError as err:
            raise ValueError(f"chat template ({self.origin}) failed: {err}") from None
        except ValueError:
            raise
        except MemoryError:
            raise ValueError(f"chat template ({self.origin}) ran out of memory rendering one "
                             "conversation: a huge string or loop in the template, not a chat "
                             "(fix: correct the template)") from None
        except Exception as err:  # a template's own error (TypeError, ZeroDivisionError, ...)
            raise ValueError(f"chat template ({self.origin}) failed: {type(err).__name__}: "
                             f"{str(err)[:200]}") from None
        return "".join(parts)

    def segments(self, messages: list[dict], *, mark_content: bool = True) -> list[Segment]:
        """The rendered conversation cut into learned / not-learned segments (see the module
        docstring), and, with `mark_content`, at the edges of message content (Segment.content);
        ValueError when the template cannot be split into turns."""
        out = self._turn_segments(messages)
        if not mark_content:
            return out
        spans = content_spans(self.render, messages, "".join(s.text for s in out), self.origin)
        return split_at(out, spans, Segment)

    def _turn_segments(self, messages: list[dict]) -> list[Segment]:
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


CHAT_TEMPLATE_FILE = "chat_template.jinja"
"""transformers (4.43+) saves a tokenizer's chat template here; it wins over the config's."""


def load_chat_template(tokenizer_json: str | Path, *, bos_token: str = "",
                       eos_token: str = "") -> ChatTemplate:
    """The tokenizer's chat template, found as transformers finds it: chat_template.jinja beside
    the tokenizer, else tokenizer_config.json's `chat_template` (a string, or the list of
    {"name", "template"} transformers writes for several: the one named "default"); without
    either, DEFAULT_CHAT_TEMPLATE. ValueError naming the file for a config that is not JSON, a
    template that is not text, or several templates none of them named "default"."""
    folder = Path(tokenizer_json).parent
    jinja = folder / CHAT_TEMPLATE_FILE
    if jinja.is_file():
        try:
            source = jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{jinja}: not a readable UTF-8 chat template ({err})") from None
        return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token, origin=str(jinja))
    config_path = folder / "tokenizer_config.json"
    source = _configured_template(config_path)
    if source is None:
        return ChatTemplate(DEFAULT_CHAT_TEMPLATE, bos_token=bos_token, eos_token=eos_token)
    return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token,
                        origin=str(config_path))


def _configured_template(config_path: Path) -> str | None:
    """tokenizer_config.json's chat template, None when there is no file or no template."""
    if not config_path.is_file():
        return None
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{config_path}: not readable JSON ({err}) (fix: repair it, or remove "
                         "it to use meshrun's default chat template)") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: must be a JSON object")
    source = config.get("chat_template")
    if isinstance(source, list):
        source = _default_of_named(source, config_path)
    if source is None:
        return None
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"{config_path}: chat_template={str(source)[:60]!r} is not a template "
                         "(a non-empty string, or a list of {\"name\", \"template\"}) (fix: "
                         "correct it, or remove the key to use meshrun's default template)")
    return source


def _default_of_named(templates: list, config_path: Path) -> str:
    """The template named "default" of transformers' list of named templates."""
    named = {}
    for entry in templates:
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str)
                and isinstance(entry.get("template"), str)):
            raise ValueError(f"{config_path}: chat_template entry {str(entry)[:60]!r} is not "
                             "{\"name\": str, \"template\": str}")
        named[entry["name"]] = entry["template"]
    if "default" not in named:
        raise ValueError(f"{config_path}: several chat templates ({', '.join(named) or 'none'})"
                         " and none named \"default\", the one transformers and meshrun use "
                         "(fix: name the one to train with \"default\")")
    return named["default"]
