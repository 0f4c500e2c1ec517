"""Reading a command's output streams with a cap: the first `cap` bytes are kept, the
rest is counted and dropped, so 100 MB of output costs a counter, not 100 MB."""

from __future__ import annotations

import os
import selectors
import time
from typing import Callable

CHUNK = 1 << 16
GRACE_S = 0.5   # after the shell exits, how long stragglers may keep a pipe open


class CappedBuffer:
    __slots__ = ("cap", "data", "size")

    def __init__(self, cap: int):
        self.cap = cap
        self.data = bytearray()
        self.size = 0

    def feed(self, chunk: bytes) -> None:
        self.size += len(chunk)
        room = self.cap - len(self.data)
        if room > 0:
            self.data += chunk[:room]

    @property
    def truncated(self) -> bool:
        return self.size > len(self.data)

    def text(self) -> str:
        """The kept bytes as text, with a marker line where output was cut."""
        text = bytes(self.data).decode("utf-8", "replace")
        if self.truncated:
            text += f"\n[output truncated: {self.size} bytes in total, first {len(self.data)} kept]\n"
        return text


def pump(fds: dict[int, CappedBuffer], deadline: float, exited: Callable[[], bool],
         kill: Callable[[], None]) -> bool:
    """Read every fd to EOF (or until the deadline, then `kill`). Returns True on timeout."""
    sel = selectors.DefaultSelector()
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)
    timed_out = False
    hard_stop = None
    try:
        while sel.get_map():
            now = time.monotonic()
            if not timed_out and now >= deadline:
                timed_out = True
                kill()
                hard_stop = now + 2.0
            if hard_stop is None and exited():
                hard_stop = now + GRACE_S
            if hard_stop is not None and now >= hard_stop:
                kill()
                break
            wait = (hard_stop if hard_stop is not None else deadline) - now
            for key, _ in sel.select(timeout=max(0.0, min(wait, 0.1 if hard_stop is None else wait))):
                chunk = os.read(key.fd, CHUNK)
                if chunk:
                    fds[key.fd].feed(chunk)
                else:
                    sel.unregister(key.fd)
    finally:
        sel.close()
    return timed_out
