"""The new run's events as the oracle writes them: numbered in the order the agent loop
consumes values, the fork's shared prefix checked and skipped, the run begun in the store
only at its first commit, and large text moved to blobs."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

from tttr.engine.replay.source import OracleError, Source

BLOB_THRESHOLD = 1024  # bytes of text kept inline in an event; longer text goes to a blob


def ids_digest(ids) -> str:
    """What a prompt event records of its token ids: blake2b-128 of their JSON."""
    return hashlib.blake2b(json.dumps(list(ids)).encode(), digest_size=16).hexdigest()


def stored_text(store, text: str, write: bool = True) -> Any:
    """`text` as an event stores it: inline, or a blob reference when it is large."""
    data = text.encode("utf-8", "surrogateescape")
    if len(data) <= BLOB_THRESHOLD or not write:
        return text
    return {"$blob": store.put_blob(data), "size": len(data)}


def read_text(store, value: Any) -> str:
    """The text an event holds, read back from its blob if it has one."""
    if isinstance(value, dict) and "$blob" in value:
        return store.get_blob(value["$blob"]).decode("utf-8", "surrogateescape")
    return value if isinstance(value, str) else ""


class EventLog:
    """Numbers and writes a run's events.

    Event `seq` counts from 0 in consumption order. In a fork, the events before `fork_seq`
    are the parent's: they are not written again, only checked to be at the same sites
    (the shared prefix is pinned, so a drift is a bug worth stopping for). With `begin`,
    the run is begun in the store only when its first step is committed: a run that fails
    before that (its setup, or a fork's shared prefix) leaves nothing behind."""

    def __init__(self, store, run_id: int | None, *, source: Source | None = None, fork_seq: int = 0,
                 write: bool = True, begin: Callable[[], int] | None = None):
        self.store = store
        self.run_id = run_id
        self.source = source
        self.fork_seq = fork_seq
        self.write = write
        self._begin = begin
        self._pending: list[tuple] = []
        self.next_seq = 0

    def emit(self, site: str, value: Any) -> None:
        seq = self.next_seq
        self.next_seq += 1
        if seq < self.fork_seq:
            if self.source is not None and self.source.events[seq].site != site:
                raise OracleError(
                    f"fork prefix drifted at seq {seq}: parent has {self.source.events[seq].site}, replay has {site}"
                )
            return
        if not self.write:
            return
        event = (seq, site, value)
        if self.run_id is None and self._begin is not None:
            self._pending.append(event)
            return
        self._append(*event)

    def _append(self, seq: int, site: str, value: Any) -> None:
        got = self.store.append(self.run_id, site, value)
        if got is not None and got != seq:
            raise OracleError(f"event numbering drifted: store gave seq {got}, oracle expected {seq}")

    @property
    def begun(self) -> bool:
        """Whether the run is in the store (always, unless it was given a `begin` not yet called)."""
        return self.run_id is not None or self._begin is None

    def begin_now(self) -> None:
        self.run_id = self._begin()
        pending, self._pending = self._pending, []
        for event in pending:
            self._append(*event)

    def commit(self, step: int | None = None, lap=None) -> None:
        """Write the step in flight (beginning the run first if it is not yet), and with
        `lap` (a `step_clock.Lap`) what step `step` took. A step wholly inside a fork's
        shared prefix is not written: its timing is its parent's."""
        if self.write and self.next_seq > self.fork_seq:
            if not self.begun:
                self.begin_now()
            self.store.commit_step(self.run_id)
            if lap is not None:
                self.store.time_step(self.run_id, step, model_ms=lap.model_ms, tool_ms=lap.tool_ms,
                                     wait_ms=lap.wait_ms)

    def discard(self) -> None:
        self._pending.clear()

    def finish(self, status: str, outcome: dict) -> None:
        if not self.write:
            return
        if not self.begun:  # cancelled inside a fork's shared prefix: still a run, incomplete
            self.begin_now()
        self.store.finish_run(self.run_id, status=status, outcome=outcome)

    # ------------------------------------------------------------------ large values
    def text_value(self, text: str) -> Any:
        return stored_text(self.store, text, self.write)

    def text_of(self, value: Any) -> str:
        return read_text(self.store, value)
