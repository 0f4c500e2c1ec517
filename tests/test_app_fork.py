"""End to end on a real recording: `tttr demo` records a task with the embedded default
model in the real sandbox; the app opens it, edits a token and a tool result, forks in a
worker (responsive, cancellable) and draws the fork next to its parent. Nothing here is
faked: these tests need the model and the sandbox, and take a minute."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tttr.app.screens.compare import CompareScreen
from tttr.app.screens.edit import EditScreen
from tttr.app.screens.timeline import TimelineScreen
from tests.app_helpers import hold_forks, open_store, run_app, wait_for
from tttr.app.widgets.fork_progress import ForkProgress
from tttr.app.widgets.side_by_side import SideBySide
from tttr.app.widgets.timeline import Timeline

pytestmark = pytest.mark.slow  # records with the default model and forks from the app

ROOT = Path(__file__).resolve().parent.parent
TASK = "write-line"


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory):
    """`tttr demo` as a user runs it, minus the terminal: it records into a fresh file."""
    db = tmp_path_factory.mktemp("demo") / "demo.db"
    out = subprocess.run(
        [sys.executable, "-m", "tttr.app", "demo", "--task", TASK, "--seed", "1", "--db", str(db), "--no-open"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stderr
    assert "recording task write-line" in out.stderr  # progress goes to the terminal
    assert out.stdout.strip().startswith(f"tttr open {db} --run ")
    return db, int(out.stdout.split("--run")[1])


def test_demo_refuses_to_overwrite_a_database(demo_db):
    db, _ = demo_db
    before = db.read_bytes()
    out = subprocess.run([sys.executable, "-m", "tttr.app", "demo", "--db", str(db), "--no-open"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "already exists" in out.stderr
    assert db.read_bytes() == before


async def until(pilot, condition, timeout=600.0):
    await wait_for(pilot, condition, timeout=timeout, poll=0.05)


def test_demo_recording_opens_on_its_timeline(demo_db):
    db, run_id = demo_db

    async def flow(app, pilot):
        assert isinstance(app.screen, TimelineScreen)
        view = app.screen.query_one(Timeline).view
        assert view.run_id == run_id and view.run.status == "complete"
        assert {view.event(i).layer for i in range(view.count)} == {"tensor", "token", "trace", "agent"}

    run_app(db, flow, run_id=run_id)


def test_edit_a_token_and_fork_shows_the_fork_beside_its_parent(demo_db):
    db, run_id = demo_db

    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        timeline.cursor = timeline.view.at("0:token:0").seq
        await pilot.pause()
        await pilot.press("e")
        assert isinstance(app.screen, EditScreen)
        alternatives = app.screen.alternatives
        assert len(alternatives) == 5
        await pilot.press("down", "enter")  # the second recorded alternative
        # Back on the timeline while the fork runs, or (a fork on a warm model can be over
        # before the key's handling returns) its comparison already pushed over the timeline.
        assert isinstance(app.screen, (TimelineScreen, CompareScreen))
        under = [s for s in app.screen_stack if isinstance(s, TimelineScreen)]
        assert len(under) == 1
        progress = under[0].query_one(ForkProgress)
        assert progress.started == 1  # the bar came up
        if isinstance(app.screen, TimelineScreen) and progress.display:  # the UI stays responsive meanwhile
            at = timeline.cursor
            await pilot.press("down")
            assert timeline.cursor == at + 1
        await until(pilot, lambda: isinstance(app.screen, CompareScreen) and bool(app.screen.query(SideBySide)))
        side = app.screen.query_one(SideBySide)
        await until(pilot, lambda: side.comparison is not None)
        comparison = side.comparison
        assert comparison.run_a == run_id and comparison.fork_site == "0:token:0"
        assert side.rows[0].a.step == side.rows[0].b.step == -1  # the setup's row, then the steps
        assert [r.fork for r in side.rows[:2]] == [False, True]  # the fork site is marked on its step
        assert any(r.first_divergence for r in side.rows) == (comparison.first is not None)
        child = app.store.run(comparison.run_b)
        assert child.parent == run_id and child.fork_site == "0:token:0"
        assert child.mutation["input"] == f"id:{alternatives[1][0]}"
        return comparison.run_b

    child = run_app(db, flow, run_id=run_id)
    store = open_store(db)
    try:
        assert store.event_at(child, "0:token:0").value["id"] != store.event_at(run_id, "0:token:0").value["id"]
    finally:
        store.close()


def test_a_fork_can_be_cancelled(demo_db, monkeypatch):
    """The real fork, held at its first progress report until `x` was pressed, so that a fast
    machine cannot finish it first."""
    db, run_id = demo_db
    held = hold_forks(monkeypatch)

    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        timeline.cursor = timeline.view.at("0:token:0").seq
        await pilot.pause()
        before = {r.id for r in app.store.runs()}
        await pilot.press("e")
        assert isinstance(app.screen, EditScreen)
        await pilot.press("down", "enter")
        screen = app.screen
        assert isinstance(screen, TimelineScreen)
        await until(pilot, lambda: screen.fork_cancel is not None)
        await pilot.press("x")
        held.set()
        await until(pilot, lambda: screen.fork_cancel is None)
        assert app.screen is screen  # no side-by-side for a cancelled fork
        assert not screen.query_one(ForkProgress).display
        new = [r for r in app.store.runs() if r.id not in before]
        assert len(new) == 1 and new[0].status == "incomplete" and new[0].parent == run_id

    try:
        run_app(db, flow, run_id=run_id)
    finally:
        held.set()
