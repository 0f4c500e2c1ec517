"""`tttr ...`: tttr files: a run's file tree at any step and the difference between two steps (issue 16).

(Being written: register() adds its subcommands.)"""

from __future__ import annotations


def register(sub, bench_sub) -> None:
    pass
