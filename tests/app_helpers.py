"""Driving the app in tests: open a session read-only, run a pilot flow, wait for a state."""

from __future__ import annotations

import asyncio
import time

from tttr.app.tui import TTTRApp

SIZE = (140, 40)


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
