"""Where a step's wall time went, as a performance panel splits a frame: the model's part
(generating the step's message: prefill and decode, or taking the recorded tokens), the
tool's part (running the command, or answering it from the recording) and the wait (the
rest: the host's own work between them, writing the step, the loop).

A step runs from the end of the previous one (the setup's end for step 0) to its commit.
The clock is `time.perf_counter` (monotonic): a few reads per step, nothing else. Timings
are measurements of this host, stored beside the events (`Store.time_step`), never events:
a replay is the same whatever they say.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import NamedTuple

from tttr.sessions.timings import seconds_ms


class Lap(NamedTuple):
    """One step's parts in ms; None for a part the step did not have."""

    model_ms: float | None
    tool_ms: float | None
    wait_ms: float | None


class StepClock:
    def __init__(self) -> None:
        self._mark = time.perf_counter()
        self._model: float | None = None
        self._tool: float | None = None

    @contextmanager
    def model(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._model = (self._model or 0.0) + time.perf_counter() - t0

    @contextmanager
    def not_model(self):
        """Inside `model()`: what is not the model's work (loading its weights), left to the wait."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._model = (self._model or 0.0) - (time.perf_counter() - t0)

    @contextmanager
    def tool(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._tool = (self._tool or 0.0) + time.perf_counter() - t0

    @property
    def open(self) -> bool:
        """Whether the model or a tool ran since the last lap."""
        return self._model is not None or self._tool is not None

    def lap(self) -> Lap:
        """The step that ends now; the next one starts now."""
        now = time.perf_counter()
        wall, self._mark = now - self._mark, now
        model, tool = self._model, self._tool
        self._model = self._tool = None
        return Lap(seconds_ms(model), seconds_ms(tool), seconds_ms(wall - (model or 0.0) - (tool or 0.0)))
