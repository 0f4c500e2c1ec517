"""Argument types shared by the commands: numbers that fit where they go.

A run id, seq, limit or seed ends up in SQLite (64-bit signed) or in a fixed-width field,
so a number beyond that is a usage error at parsing (exit 2, one line), never a traceback
from deep inside."""

from __future__ import annotations

import argparse

INT64_MAX = 2**63 - 1


def bounded_int(lo: int = 0, hi: int = INT64_MAX, what: str = "a number"):
    """An argparse type: an integer in lo..hi."""

    def parse(text: str) -> int:
        stripped = text.strip()
        if len(stripped) > 25:  # int() refuses >4300 digits with its own message; this is kinder
            raise argparse.ArgumentTypeError(f"{stripped[:20]}… is not {what} in {lo}..{hi}")
        try:
            value = int(stripped)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; give {what} in {lo}..{hi}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is out of range; give {what} in {lo}..{hi}")
        return value

    parse.__name__ = what  # argparse names the type in its messages
    return parse


run_id = bounded_int(0, INT64_MAX, "a run id")
count = bounded_int(0, INT64_MAX, "a number >= 0")
seed = bounded_int(0, INT64_MAX, "a seed")
steps = bounded_int(1, 10_000, "a step count")
positive = bounded_int(1, INT64_MAX, "a number >= 1")
sandbox_step = bounded_int(-1, INT64_MAX, "an agent step (-1 = setup)")
threads = bounded_int(1, 4096, "a thread count")
bench_events = bounded_int(1000, 100_000_000, "an event count")
