"""`tttr ...`: tttr suite and tttr stats: record runs under four pinning conditions and decompose their variance (issue 17).

(Being written: register() adds its subcommands.)"""

from __future__ import annotations


def register(sub, bench_sub) -> None:
    pass
