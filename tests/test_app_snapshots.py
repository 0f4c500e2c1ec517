"""Snapshot tests (pytest-textual-snapshot): the runs list, a timeline on a token, the
edit dialog refusing a value, two runs side by side, and the timeline at 80x24 with a
bookmark and the position indicator. Update them after a deliberate
change of the look with `pytest tests/test_app_snapshots.py --snapshot-update`."""

from __future__ import annotations

import pytest
from tttr.app.tui import TTTRApp

from tests.app_helpers import two_runs

SIZE = (130, 36)
TOKENS = 10


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return two_runs(tmp_path_factory.mktemp("snap") / "session.db", 6, TOKENS)


@pytest.fixture
def store(db):
    from tttr.sessions.store import Store

    store = Store.open(db, create=False, readonly=True)
    yield store
    store.close()


def test_runs_screen(snap_compare, store):
    assert snap_compare(TTTRApp(store, load_tokenizer=False), press=["space"], terminal_size=SIZE)


def test_timeline_on_a_token(snap_compare, store):
    app = TTTRApp(store, run_id=1, load_tokenizer=False)
    assert snap_compare(app, press=["right", "right", "full_stop", "full_stop", "full_stop"], terminal_size=SIZE)


def test_edit_dialog_refuses_a_bad_clock(snap_compare, store):
    async def to_clock(pilot):
        timeline = pilot.app.screen.query_one("Timeline")
        timeline.cursor = timeline.view.at("1:clock").seq
        await pilot.pause()
        await pilot.press("e", *"tomorrow", "enter")
        await pilot.pause()

    app = TTTRApp(store, run_id=1, load_tokenizer=False)
    assert snap_compare(app, terminal_size=SIZE, run_before=to_clock)


def test_two_runs_side_by_side(snap_compare, store):
    async def compare(pilot):
        await pilot.press("space", "down", "space", "d")
        side = pilot.app.screen.query_one("SideBySide")
        for _ in range(500):
            if side.comparison is not None:
                break
            await pilot.pause(0.02)
        await pilot.pause()
        await pilot.pause()  # the footer shows enter/b/f enabled once the rows are there

    assert snap_compare(TTTRApp(store, load_tokenizer=False), terminal_size=SIZE, run_before=compare)


def test_timeline_at_80x24(snap_compare, store):
    """The smallest terminal the app is laid out for: the run's status and outcome, the
    position, the keys `?` and `q`, and the message strip all fit."""
    async def bookmark_and_step(pilot):
        await pilot.press("right", "right", "m", "full_stop", "full_stop")
        pilot.app.clear_notifications()  # their timeout is wall-clock: not part of the picture
        await pilot.pause()

    app = TTTRApp(store, run_id=1, load_tokenizer=False)
    assert snap_compare(app, terminal_size=(80, 24), run_before=bookmark_and_step)
