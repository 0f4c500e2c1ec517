"""Forking from the app: the engine's `fork` run in a worker thread, reporting by message.

The worker opens its own store connection (SQLite connections stay in the thread that
made them); the app's connection keeps reading while the fork writes, which WAL allows.
"""

from __future__ import annotations

import threading
from pathlib import Path

from textual.message import Message


class ForkProgressed(Message):
    """The fork worker finished `done` of about `total` steps."""

    def __init__(self, done: int, total: int | None, text: str) -> None:
        super().__init__()
        self.done, self.total, self.text = done, total, text


class ForkFinished(Message):
    """The fork is stored as run `result.run_id` (complete, or incomplete if cancelled)."""

    def __init__(self, parent: int, site: str, value: str, result, cancelled: bool) -> None:
        super().__init__()
        self.parent, self.site, self.value = parent, site, value
        self.result, self.cancelled = result, cancelled


class ForkFailed(Message):
    def __init__(self, site: str, error: str) -> None:
        super().__init__()
        self.site, self.error = site, error


def run_fork(db_path: Path, run_id: int, site: str, value: str, *, runtime, unsafe_no_sandbox: bool,
             progress, cancel: threading.Event):
    """Fork `run_id` at `site` with `value` on a store connection of its own."""
    from tttr.engine.replay.runs import fork
    from tttr.sessions.store import Store

    store = Store.open(db_path, create=False)
    try:
        return fork(store, run_id, site, value, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox,
                    progress=progress, cancel=cancel)
    finally:
        store.close()
