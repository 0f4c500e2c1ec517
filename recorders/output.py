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


class Feed:
    """A stream written into a pipe while the command runs (the sandbox's seeded
    /dev/urandom): `chunk()` gives the next bytes; what the pipe did not take is kept."""

    __slots__ = ("fd", "chunk", "pending")

    def __init__(self, fd: int, chunk: Callable[[], bytes]):
        self.fd, self.chunk, self.pending = fd, chunk, b""

    def fill(self, most: int = 16) -> None:
        """Write until the pipe is full (the fd is non-blocking), at most `most` chunks, so
        that a reader as fast as the writer cannot keep the pump from its other work."""
        for _ in range(most):
            if not self.pending:
                self.pending = self.chunk()
            try:
                n = os.write(self.fd, self.pending)
            except (BlockingIOError, InterruptedError):
                return
            self.pending = self.pending[n:]


WATCH_EVERY_S = 0.25


def pump(fds: dict[int, CappedBuffer], deadline: float, exited: Callable[[], bool],
         kill: Callable[[], None], watch: Callable[[], str | None] | None = None,
         feed: Feed | None = None) -> str | None:
    """Read every fd to EOF (or until the deadline, then `kill`), keeping `feed`'s pipe
    full meanwhile. Every WATCH_EVERY_S, `watch()` may name a limit the command has hit;
    it is then killed too. Returns "timeout", the watcher's limit, or None."""
    sel = selectors.DefaultSelector()
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)
    if feed is not None:
        sel.register(feed.fd, selectors.EVENT_WRITE)
    hit: str | None = None
    hard_stop = None
    next_watch = time.monotonic() + WATCH_EVERY_S
    try:
        while len(sel.get_map()) > (feed is not None):
            now = time.monotonic()
            if hit is None and now >= deadline:
                hit = "timeout"
                kill()
                hard_stop = now + 2.0
            if hit is None and watch is not None and now >= next_watch:
                hit = watch()
                next_watch = now + WATCH_EVERY_S
                if hit is not None:
                    kill()
                    hard_stop = now + 2.0
            if hard_stop is None and exited():
                hard_stop = now + GRACE_S
            if hard_stop is not None and now >= hard_stop:
                kill()
                break
            wait = (hard_stop if hard_stop is not None else min(deadline, next_watch)) - now
            for key, _ in sel.select(timeout=max(0.0, min(wait, 0.1 if hard_stop is None else wait))):
                if feed is not None and key.fd == feed.fd:
                    feed.fill()
                    continue
                chunk = os.read(key.fd, CHUNK)
                if chunk:
                    fds[key.fd].feed(chunk)
                else:
                    sel.unregister(key.fd)
    finally:
        sel.close()
    return hit
