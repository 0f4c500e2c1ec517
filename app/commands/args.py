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


def add_database(parser, help: str) -> None:
    """The one rule for naming a database: every command takes `--db FILE`; the commands
    that only read one (info, runs, events, open) also take it as their first argument."""
    parser.add_argument("db", nargs="?", metavar="DB", help=f"{help} (or --db DB)")
    parser.add_argument("--db", dest="db_option", metavar="DB", help="the database, as an option")
    parser.set_defaults(resolve_db=True)


def resolve_database(parser, args) -> None:
    """After parsing: one database, however it was given (argparse's own error otherwise)."""
    if not getattr(args, "resolve_db", False):
        return
    given = [d for d in (args.db, args.db_option) if d is not None]
    if not given:
        parser.error("give the database: tttr COMMAND DB ... or --db DB")
    if len(given) == 2 and given[0] != given[1]:
        parser.error(f"two databases given ({given[0]} and {given[1]}): give one")
    args.db = given[0]
