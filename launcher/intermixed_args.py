"""Overrides anywhere on the command line, as Hydra users type them.

argparse gives a `nargs="*"` positional only the first run of words it meets, so
`meshrun plan --search --write-sweep best.yaml runs_dir=x` used to end in "unrecognized
arguments: runs_dir=x". Here every word argparse leaves over that is not a flag joins the
command's overrides, in the order typed (a later override still wins). A left-over flag is
refused as before. (`ArgumentParser.parse_intermixed_args` refuses sub-commands.)
"""
from __future__ import annotations

import argparse

OVERRIDE_DESTS = ("overrides", "words")
"""The positional that holds a command's overrides: `overrides` (run, plan, resume, preflight)
or `words` (sweep, whose first words may name `status`/`retry`)."""


def parse_intermixed(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """`parser.parse_args(argv)`, but overrides may come before, between or after flags."""
    args, left = parser.parse_known_args(argv)
    if not left:
        return args
    dest = next((d for d in OVERRIDE_DESTS if isinstance(getattr(args, d, None), list)), None)
    flags = [word for word in left if word.startswith("-")]
    if dest is None or flags:
        parser.error(f"unrecognized arguments: {' '.join(flags or left)}")
    getattr(args, dest).extend(left)
    return args
