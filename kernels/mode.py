"""The one switch between stock kernels (`fast`) and batch-invariant ones (`invariant`, and
`invariant-q8`: the same, except that products by weights held as GGUF blocks quantize each
activation row to 8 bits first and sum integer products, as llama.cpp does; kernels.cq8).

The mode is process-wide (a context variable, so threads started inside a `kernel_mode`
block do not inherit it by accident). `kernel_mode(...)` restores the previous mode in
`finally`, nests, and never prints.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

from tttr.sessions.errors import TTTRError

MODES = ("fast", "invariant", "invariant-q8")
Q8 = "invariant-q8"  # fp32 everywhere but the block products' activations (kernels.cq8)
INVARIANT_MODES = ("invariant", Q8)  # each row's bits independent of the batch: batching, prefix reuse
BASE_MODES = ("fast", "invariant")  # the fp32 pair the kernel benchmarks and the determinism check compare


class KernelModeError(TTTRError, ValueError):
    pass


_mode: contextvars.ContextVar[str] = contextvars.ContextVar("tttr_kernel_mode", default="fast")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise KernelModeError(f"unknown kernel mode {mode!r}: use one of {', '.join(MODES)}")
    return mode


def is_invariant(mode: str | None) -> bool:
    """Whether `mode` gives each row bits that do not depend on the batch (sequences in it may
    share passes, reuse prefixes and be bisected in batches)."""
    return mode in INVARIANT_MODES


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
