"""Driving the app in tests: a session of two generated runs, open it read-only, run a
pilot flow, wait for a state."""

from __future__ import annotations

import asyncio
import threading
import time

from tttr.app.bench import COMMANDS, generate
from tttr.app.tui import TTTRApp

SIZE = (140, 40)
OTHER = COMMANDS[:2] + ("rm -rf /var/log/old",) + COMMANDS[3:]  # the second run of `two_runs`


def two_runs(path, steps: int, tokens: int):
    """A session of two generated runs of `steps` steps (as `tttr bench app` writes them);
    the second takes another command at step 2 (`OTHER`). Returns `path`."""
    per_step = 2 * tokens + 5
    generate(path, steps * per_step + 3, seed=1, tokens_per_step=tokens)
    generate(path, steps * per_step + 3, seed=2, tokens_per_step=tokens, commands=OTHER)
    return path


def hold_forks(monkeypatch) -> threading.Event:
    """Make the app's real forks wait at their first progress report until the returned event
    is set (so a fast machine cannot finish one between a flow's key presses); set it in a
    `finally` too."""
    from tttr.app import forking
    from tttr.app.screens import timeline_fork

    held = threading.Event()

    def held_fork(*args, progress, **kwargs):
        def slow_progress(*report):
            progress(*report)
            held.wait(timeout=60)

        return forking.run_fork(*args, progress=slow_progress, **kwargs)

    monkeypatch.setattr(timeline_fork, "run_fork", held_fork)
    return held


def open_store(path):
    from tttr.sessions.store import Store

    return Store.open(path, create=False, readonly=True)


def run_app(db, flow, *, run_id=None, load_tokenizer=True, size=SIZE):
    """Run `flow(app, pilot)` against the app on `db` in a terminal of `size`; returns
    what the flow returns."""

    async def main():
        store = open_store(db)
        try:
            app = TTTRApp(store, run_id=run_id, load_tokenizer=load_tokenizer)
            async with app.run_test(size=size) as pilot:
                await pilot.pause()
                return await flow(app, pilot)
        finally:
            store.close()

    return asyncio.run(main())


async def wait_for(pilot, condition, timeout=10.0, poll=0.02):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError("the app did not get there in time")
        await pilot.pause(poll)
