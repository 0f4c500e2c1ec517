"""Forking from the app: the run's kind checks the fork and makes it, as `tttr fork` does, in
a worker thread that reports by message.

The check reads a read-only connection of its own and writes nothing when it refuses; the
fork writes on another (SQLite connections stay in the thread that made them). The app's
connection keeps reading while the fork writes, which WAL allows.
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
    """Fork `run_id` at `site` with `value` as its kind forks it, computing with `runtime` (the
    app's, its model loaded once); `progress(done, total, text)`; once `cancel` is set the
    fork stops early and is stored incomplete. A refusal (the kind's check) raises before
    anything is written. The kind's result: a RunResult (`run_id`, `status`; a program's
    ReplayResult is one)."""
    from tttr.engine.kinds import ForkRequest, kind_of
    from tttr.sessions.store import Store

    request = ForkRequest(site, value, model=str(runtime.path), unsafe_no_sandbox=unsafe_no_sandbox, runtime=runtime)
    with Store.open(db_path, create=False, readonly=True) as reader:
        run = reader.run(run_id)
        kind = kind_of(run)
        plan = kind.check_fork(reader, run, request)
    # A kind that runs a program reports lines of its own, and its steps apart (see RunKind.fork).
    lines = (lambda text: progress(0, None, text)) if kind.runs_program else progress
    return kind.fork(str(db_path), plan, lines, cancel=cancel, steps=progress)
