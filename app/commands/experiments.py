"""`tttr ...`: tttr triage, tttr bisect and tttr bench bisect: locate the layer and the delta that flips a run (issue 17).

(Being written: register() adds its subcommands.)"""

from __future__ import annotations


def register(sub, bench_sub) -> None:
    pass
