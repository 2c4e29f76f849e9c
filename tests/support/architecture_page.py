"""ARCHITECTURE.md's generated part: the import table, rendered from the import-layer test's
table (tests/unit/test_import_layers.py: PACKAGES, ALLOWED, TORCH_FREE), kept between two
marker lines of the page, and rewritten there in place."""
from __future__ import annotations

REGENERATE = "python -m tests.unit.test_import_layers"
BEGIN = (f"<!-- import table: generated from tests/unit/test_import_layers.py by `{REGENERATE}`;"
         " edit the table there, then run that -->")
END = "<!-- end of the generated import table -->"


def _names(modules: tuple[str, ...]) -> str:
    return ", ".join(f"`{module}`" for module in modules) or "nothing of ours"


def import_table(*, packages: tuple[str, ...], allowed: dict[str, tuple[str, ...]],
                 torch_free: tuple[str, ...]) -> str:
    """The page's import table (Markdown), one row per package in `packages` order."""
    rows = [f"| `{package}` | {_names(allowed[package])} |" for package in packages]
    return "\n".join([
        "| package | may import, of meshrun's modules (each with everything under it) |",
        "|---|---|",
        *rows,
        "",
        f"Never import torch, not even inside a function: {_names(torch_free)}.",
    ])


def _bounds(text: str) -> tuple[int, int]:
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no import table between the lines {BEGIN!r} and {END!r}")
    return start + len(BEGIN), end


def marked_block(text: str) -> str:
    """What the page shows between the markers (without the blank lines around it)."""
    start, end = _bounds(text)
    return text[start:end].strip("\n")


def with_block(text: str, block: str) -> str:
    """`text` with `block` between the markers in place of what was there."""
    start, end = _bounds(text)
    return f"{text[:start]}\n{block}\n{text[end:]}"
