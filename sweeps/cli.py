"""The sweep commands of `meshrun`, registered through the `meshrun.commands` entry point."""
from __future__ import annotations


def register(subparsers) -> None:
    """Add `sweep` (and its sub-commands) and `compare` to the meshrun parser."""
