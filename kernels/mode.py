"""The one switch between stock kernels (`fast`) and batch-invariant ones (`invariant`).

The mode is process-wide (a context variable, so threads started inside a `kernel_mode`
block do not inherit it by accident). `kernel_mode(...)` restores the previous mode in
`finally`, nests, and never prints.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

from tttr.sessions.errors import TTTRError

MODES = ("fast", "invariant")


class KernelModeError(TTTRError, ValueError):
    pass


_mode: contextvars.ContextVar[str] = contextvars.ContextVar("tttr_kernel_mode", default="fast")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise KernelModeError(f"unknown kernel mode {mode!r}: use one of {', '.join(MODES)}")
    return mode


def get_mode() -> str:
    return _mode.get()


def set_mode(mode: str) -> None:
    _mode.set(check_mode(mode))


@contextlib.contextmanager
def kernel_mode(mode: str) -> Iterator[str]:
    token = _mode.set(check_mode(mode))
    try:
        yield mode
    finally:
        _mode.reset(token)
