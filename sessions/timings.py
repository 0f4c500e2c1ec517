"""What each step of a run took on the host that recorded it: the model's time, the tool's
time and the wait (the rest of the step's wall time), in milliseconds.

Timings are measurements, not part of the replay contract: they live in their own table
(`step_times`, migration 4), never in `events`, so replays, diffs, digests and the stored
events are the same whether a run has them or not. A value is NULL where the step had no
such part (a served call runs no tool; the first call of a run has no wait before it).

Read back, a fork's steps before its fork point are its parent's (as its events are); the
step that holds the fork point and every later one are the fork's own measurements. The
file is untrusted: a value that is not a finite number in [0, MAX_MS] reads as absent.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any, NamedTuple

MAX_MS = 1e10  # about four months: anything larger is not a step's time
PARTS = ("model_ms", "tool_ms", "wait_ms")


class StepTime(NamedTuple):
    """One step's timing in ms; None where the step had no such part or it was not recorded."""

    step: int
    model_ms: float | None
    tool_ms: float | None
    wait_ms: float | None

    def to_json(self) -> dict:
        return {"step": self.step, "model_ms": self.model_ms, "tool_ms": self.tool_ms, "wait_ms": self.wait_ms}


def ms(value: Any) -> float | None:
    """A stored or given duration as milliseconds, or None when it is not one (a wrong type,
    negative, NaN, infinite or absurdly large)."""
    if type(value) not in (int, float):  # never bool, str, bytes
        return None
    value = float(value)
    return value if math.isfinite(value) and 0.0 <= value <= MAX_MS else None


def seconds_ms(seconds: float | None) -> float | None:
    """Seconds measured with perf_counter as stored milliseconds (3 decimals; a tiny negative
    difference from two clocks' rounding reads as 0)."""
    if seconds is None:
        return None
    return round(max(seconds, 0.0) * 1000, 3)


def write(conn: sqlite3.Connection, run_id: int, step: int, model_ms, tool_ms, wait_ms) -> None:
    conn.execute("INSERT OR REPLACE INTO step_times (run, step, model_ms, tool_ms, wait_ms) VALUES (?,?,?,?,?)",
                 (run_id, step, ms(model_ms), ms(tool_ms), ms(wait_ms)))


def has_table(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'step_times'").fetchone() is not None


def read(conn: sqlite3.Connection, segments: list[tuple[int, int, int]]) -> list[StepTime]:
    """The timings of the run made of `segments` ((run that stores them, first seq, end seq),
    oldest first, as `Store._segments` gives them), by step. A source's row counts for a step
    whose events end inside its segment, so a fork's parent lends the steps wholly before the
    fork point and the fork's own rows cover the rest."""
    if not has_table(conn):  # a damaged or hand-made file: not recorded, never an error
        return []
    found: dict[int, StepTime] = {}
    for source, first, end in segments:
        rows = conn.execute(
            "SELECT t.step, t.model_ms, t.tool_ms, t.wait_ms FROM step_times t"
            " JOIN steps s ON s.run = t.run AND s.step = t.step"
            " WHERE t.run = ? AND s.last_seq >= ? AND s.last_seq < ? AND typeof(t.step) = 'integer'",
            (source, first, end))
        for step, model, tool, wait in rows:
            timing = StepTime(step, ms(model), ms(tool), ms(wait))
            if timing[1:] != (None, None, None):
                found[step] = timing
    return [found[s] for s in sorted(found)]


def copy(conn: sqlite3.Connection, src: str) -> None:
    """A merge's: the attached source `src`'s rows, their runs mapped by the temp table rmap."""
    conn.execute("INSERT OR REPLACE INTO main.step_times (run, step, model_ms, tool_ms, wait_ms)"
                 " SELECT m.new, t.step, t.model_ms, t.tool_ms, t.wait_ms"
                 f" FROM {src}.step_times t JOIN rmap m ON m.old = t.run")
