"""Chat templates rendered on the data under a time and a memory bound.

A chat template is code from a tokenizer's folder. It is compiled and rendered in jinja2's
immutable sandbox (no attribute escapes; launcher/data/sft_template.py also stops a rendering
past MAX_RENDER_CHARS), and here in a child process (`python -m launcher.data.template_render`)
whose address space is capped at RENDER_MEMORY_BYTES; a conversation that takes longer than
RENDER_TIMEOUT_S to render stops the child and is named (file:line), so a template with a
huge loop is refused instead of hanging `meshrun data prepare-sft`.
"""
from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from pathlib import Path

from launcher.data.sft_template import ChatTemplate, Segment

RENDER_TIMEOUT_S = 10.0
"""Seconds one conversation may take to render (a real one takes milliseconds)."""
START_TIMEOUT_S = 120.0
"""Seconds the rendering process may take to start (an interpreter and jinja2's import: well
under a second, more on a loaded machine); not counted in RENDER_TIMEOUT_S, so a slow start is
never taken for a looping template."""
RENDER_MEMORY_BYTES = 2 << 30
"""Address-space cap of the rendering process."""


class BoundedTemplate:
    """`segments(messages, where)` as ChatTemplate's, rendered by a child process; use it as a
    context manager (the child ends with the block)."""

    def __init__(self, template: ChatTemplate, *, timeout_s: float | None = None):
        self.origin, self.source = template.origin, template.source
        self.timeout_s = RENDER_TIMEOUT_S if timeout_s is None else timeout_s
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        self._child = subprocess.Popen(
            [sys.executable, "-m", "launcher.data.template_render"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
            encoding="utf-8")
        self._select = selectors.DefaultSelector()
        self._select.register(self._child.stdout, selectors.EVENT_READ)
        self._send({"source": template.source, "bos_token": template.bos_token,
                    "eos_token": template.eos_token, "origin": template.origin,
                    "max_chars": template.max_chars, "memory_bytes": RENDER_MEMORY_BYTES})
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Wait for the child's ready line (its imports done), START_TIMEOUT_S at most."""
        if not self._select.select(timeout=START_TIMEOUT_S):
            self.close()
            raise ValueError(f"chat template ({self.origin}): the renderer did not start in "
                             f"{START_TIMEOUT_S:.0f} s (fix: retry on a less loaded machine)")
        if not self._child.stdout.readline():
            raise ValueError(f"chat template ({self.origin}): the renderer stopped at its start "
                             f"({self._stop_and_why()})")

    def __enter__(self) -> BoundedTemplate:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def segments(self, messages: list[dict], where: str = "a conversation", *,
                 mark_content: bool = True) -> list[Segment]:
        self._send({"messages": messages, "mark_content": mark_content})
        if not self._select.select(timeout=self.timeout_s):
            self.close()
            raise ValueError(f"chat template ({self.origin}) took over {self.timeout_s:.0f} s to "
                             f"render {where}: a loop in the template, not a chat (fix: correct "
                             "the template)")
        line = self._child.stdout.readline()
        if not line:
            raise ValueError(f"chat template ({self.origin}) stopped the renderer on {where}"
                             f" ({self._stop_and_why()})")
        reply = json.loads(line)
        if "error" in reply:
            raise ValueError(f"{where}: {reply['error']}")
        return [Segment(text, learned, content) for text, learned, content in reply["segments"]]

    def _stop_and_why(self) -> str:
        """End the child; the last line it wrote to stderr (its error), else 'no message'."""
        if self._child.poll() is None:
            self._child.kill()
        self._child.wait()
        why = self._child.stderr.read().strip().splitlines()
        self.close()
        return why[-1] if why else "no message"

    def close(self) -> None:
        if self._child.poll() is None:
            self._child.kill()
        self._child.wait()
        for stream in (self._child.stdin, self._child.stdout, self._child.stderr):
            stream.close()
        self._select.close()

    def _send(self, payload) -> None:
        try:
            self._child.stdin.write(json.dumps(payload) + "\n")
            self._child.stdin.flush()
        except BrokenPipeError:
            raise ValueError(f"chat template ({self.origin}): the renderer stopped") from None


def _serve() -> None:
    """The child: compile the template from the first line, then render one conversation per
    line ({"messages", "mark_content"}), answering {"segments": [[text, learned, content], ...]}
    or {"error": message}."""
    import resource

    config = json.loads(sys.stdin.readline())
    limit = config["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    template = ChatTemplate(config["source"], bos_token=config["bos_token"],
                            eos_token=config["eos_token"], origin=config["origin"],
                            max_chars=config["max_chars"])
    sys.stdout.write(json.dumps({"ready": True}) + "\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            segments = template.segments(request["messages"],
                                         mark_content=request["mark_content"])
            reply = {"segments": [[s.text, s.learned, s.content] for s in segments]}
        except ValueError as err:
            reply = {"error": str(err)}
        except MemoryError:
            reply = {"error": f"chat template ({template.origin}) ran out of memory "
                              f"({limit >> 20} MiB cap) rendering it"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
