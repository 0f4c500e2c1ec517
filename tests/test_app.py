"""The app, driven by Textual's pilot: open, step, search, help, diff, edit validation,
and bad databases. The database is written through the real store by the same generator
`tttr bench app` uses (agent-loop shaped events); flows that need a real recording and
the model (fork, demo) are in test_app_fork.py."""

from __future__ import annotations

import hashlib
import io
import sqlite3

import pytest
from tttr.app.bench import COMMANDS, generate
from tttr.app.runview import RunView
from tttr.app.screens.compare import CompareScreen
from tttr.app.screens.edit import EditScreen
from tttr.app.screens.help import HelpScreen
from tttr.app.screens.runs import RunsScreen
from tttr.app.screens.search import SearchScreen
from tttr.app.screens.timeline import TimelineScreen
from tttr.app.widgets.detail import DetailPane
from tttr.app.widgets.message import MessageStrip
from tttr.app.widgets.side_by_side import SideBySide
from tttr.app.widgets.timeline import Timeline

from tests.app_helpers import OTHER, open_store, two_runs, wait_for
from tests.app_helpers import run_app as _run_app

TOKENS = 12


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """Two runs of eight steps; the second takes another command at step 2."""
    return two_runs(tmp_path_factory.mktemp("app") / "session.db", 8, TOKENS)


def run_app(db, flow, *, run_id=None):
    # The generated sessions name no real model: no tokenizer to load.
    return _run_app(db, flow, run_id=run_id, load_tokenizer=False)


def test_open_lists_runs_and_enter_opens_a_timeline(db):
    async def flow(app, pilot):
        assert isinstance(app.screen, RunsScreen)
        table = app.screen.query_one("#runs")
        assert table.row_count == 2
        row = [str(c) for c in table.get_row_at(0)]
        assert "#1" in row and "rotate-logs" in row and "invariant" in row and "recorded" in row
        await pilot.press("enter")
        assert isinstance(app.screen, TimelineScreen)
        timeline = app.screen.query_one(Timeline)
        # on the step tree: the setup step's row, its detail the task set up at its clock
        assert timeline.on_step_row and timeline.view.event(timeline.cursor).kind == "setup"
        assert timeline.view.run_id == 1 and "clock" in app.screen.query_one(DetailPane).text
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)

    run_app(db, flow)


def test_stepping_keys_move_the_cursor_and_the_detail_follows(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        view: RunView = timeline.view
        detail = app.screen.query_one(DetailPane)
        await pilot.press("z", "home", "down")  # every step expanded: one row per event
        assert timeline.cursor == 1
        await pilot.press("right")  # next step: the first event of step 0
        assert view.event(timeline.cursor).step == 0
        assert view.event(timeline.cursor - 1).step == -1
        await pilot.press("right")
        first_of_1 = timeline.cursor
        assert view.event(first_of_1).step == 1 and view.event(first_of_1 - 1).step == 0
        await pilot.press("left")  # back to the start of step 0
        assert view.event(timeline.cursor).step == 0 and view.event(timeline.cursor - 1).step == -1
        await pilot.press("full_stop")  # next event of the chosen layer (token)
        event = view.event(timeline.cursor)
        assert event.kind == "token"
        text = detail.text
        assert "logprob" in text and "top-5 alternatives" in text and "batch" in text and "digest" in text
        assert event.value["text"] in app.screen.query_one(MessageStrip).render().plain
        await pilot.press("l", "l")  # token -> trace -> agent
        assert timeline.chosen_layer == "agent"
        await pilot.press("full_stop")
        assert view.event(timeline.cursor).layer == "agent"
        await pilot.press("l", "comma")  # layer tensor, previous one
        at = timeline.cursor
        assert view.event(at).kind == "logits"
        await pilot.press("end")
        assert timeline.cursor == view.count - 1
        await pilot.press("home")
        assert timeline.cursor == 0
        # the tool event of a step: command, exit code, duration, clock in the pane
        tool = view.at("1:tool")
        timeline.cursor = tool.seq
        await pilot.pause()
        text = detail.text
        assert "exit code" in text and "duration" in text and "clock" in text and tool.value["cmd"] in text

    run_app(db, flow, run_id=1)


def test_fuzzy_search_jumps_to_the_hit(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        await pilot.press("slash")
        assert isinstance(app.screen, SearchScreen)
        search_screen = app.screen
        await wait_for(pilot, lambda: search_screen.corpus is not None)  # indexed in a worker
        await pilot.press(*"gzip -k")
        await pilot.press("enter")
        assert isinstance(app.screen, TimelineScreen)
        event = timeline.view.event(timeline.cursor)
        assert event.kind == "tool" and "gzip" in event.value["cmd"]

    run_app(db, flow, run_id=1)


def test_help_screen_lists_the_keys(db):
    async def flow(app, pilot):
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        shown = app.screen.content.plain
        for words in ("next step", "next in layer", "edit & fork", "search"):
            assert words in shown
        await pilot.press("escape")
        assert isinstance(app.screen, TimelineScreen)

    run_app(db, flow, run_id=1)


def test_diff_of_two_runs_side_by_side(db):
    async def flow(app, pilot):
        await pilot.press("space", "down", "space", "d")
        assert isinstance(app.screen, CompareScreen)
        side = app.screen.query_one(SideBySide)
        await wait_for(pilot, lambda: side.comparison is not None)
        rows = side.rows
        assert len(rows) == 1 + 8  # the setup (its clock and tree), then the steps
        assert rows[0].a.step == rows[0].b.step == -1 and rows[0].a.output != rows[0].b.output
        differing = [i for i, r in enumerate(rows) if not r.same]
        assert differing == [0, 3]  # the two setups' trees differ, and step 2's command
        assert rows[3].a.action == COMMANDS[2] and rows[3].b.action == OTHER[2]
        assert side.comparison.first is not None
        # one widget paints both sides: moving the cursor scrolls both at once
        await pilot.press("n")
        assert side.cursor == 3
        await pilot.press("p")
        assert side.cursor == 0

    run_app(db, flow)


def test_an_invalid_edit_keeps_the_dialog_open_with_the_reason(db):
    before = hashlib.sha256(db.read_bytes()).hexdigest()

    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        timeline.cursor = timeline.view.at("1:clock").seq
        await pilot.pause()
        await pilot.press("e")
        assert isinstance(app.screen, EditScreen)
        await pilot.press(*"yesterday", "enter")
        assert isinstance(app.screen, EditScreen)
        error = str(app.screen.query_one("#edit-error").render())
        assert "does not parse" in error and "'yesterday'" in error
        await pilot.press("escape")
        assert isinstance(app.screen, TimelineScreen)
        # a prompt cannot be edited: the dialog does not open
        timeline.cursor = timeline.view.at("1:prompt").seq
        await pilot.press("e")
        assert isinstance(app.screen, TimelineScreen)

    run_app(db, flow, run_id=1)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_at_80x24_a_tokens_edit_dialog_with_its_error_keeps_its_buttons_on_screen(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        timeline.cursor = timeline.view.at("1:token:3").seq
        await pilot.pause()
        await pilot.press("e")
        dialog = app.screen
        assert isinstance(dialog, EditScreen) and dialog.alternatives  # the tallest dialog: a list of them
        dialog.query_one("#edit-value").value = "id:99999999"
        await pilot.press("ctrl+s")  # refused: the error line makes it taller still
        assert app.screen is dialog and dialog.query_one("#edit-error").has_class("-shown")
        await pilot.pause()
        frame = dialog.query_one("#edit-dialog").region
        assert frame.y >= 0 and frame.bottom <= 24  # the whole frame is on screen
        button = dialog.query_one("#edit-fork")
        button.focus()  # tab reaches it: it scrolls into view inside the frame
        await wait_for(pilot, lambda: frame.y < button.region.y and button.region.bottom <= frame.bottom)

    _run_app(db, flow, run_id=1, load_tokenizer=False, size=(80, 24))


def test_search_ranks_substring_hits_first_and_windowed_reads_find_layers(db):
    from tttr.app.search import build_corpus, search

    store = open_store(db)
    try:
        view = RunView(store, 1)
        hits = search(build_corpus(view), "gzip")
        assert hits and hits[0].entry.what == "command" and "gzip" in hits[0].entry.text
        assert search(build_corpus(view), "   ") == []
        last = view.count - 1
        back = view.prev_of_layer(last, "tensor")
        assert view.event(back).layer == "tensor"
        assert all(view.event(i).layer != "tensor" for i in range(back + 1, last + 1))
        assert view.next_of_layer(last, "token") is None
    finally:
        store.close()


def test_batch_rows_read_as_ranges():
    from tttr.app.describe import rows_label

    assert rows_label(list(range(320))) == "0–319"
    assert rows_label([3]) == "3"
    assert rows_label([0, 1, 4, 6, 7]) == "0–1, 4, 6–7"


@pytest.mark.parametrize("kind", ["foreign", "garbage", "newer", "damaged"])
def test_a_bad_database_is_refused_before_the_app_starts(tmp_path, kind, capsys):
    from tttr.app.cli import main

    path = tmp_path / f"{kind}.db"
    if kind == "foreign":
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.commit()
        conn.close()
    elif kind == "garbage":
        path.write_bytes(b"SQLite format 3\x00" + b"\x07" * 3000)
    elif kind == "newer":
        generate(path, 200, tokens_per_step=4)
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA user_version = 999")
        conn.commit()
        conn.close()
    else:  # a sound header, pages scribbled over in the middle
        generate(path, 3000, tokens_per_step=40)
        data = bytearray(path.read_bytes())
        page = 4096
        for offset in range(3 * page, len(data) - page, 2 * page):
            data[offset + 100 : offset + 400] = b"\xff" * 300
        path.write_bytes(bytes(data))
    before = path.read_bytes()
    assert main(["open", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tttr: error: ") and str(path) in err
    assert path.read_bytes() == before


def test_an_agent_runs_setup_reads_as_its_task_clock_and_tree_not_raw_json():
    from rich.console import Console

    from tttr.app.describe import summary
    from tttr.sessions.records import Event

    value = {"task": "today-report", "clock": "2026-03-02T09:00:00", "tree": "3fa2c1d9e8b7a6f5", "snapshot": "ab" * 32}
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(summary(Event(1, 1, -1, "trace", "setup", "setup:setup", value)))
    line = console.export_text()
    assert "task today-report · clock 2026-03-02T09:00:00 · start tree 3fa2c1d9e8b7" in line, line
    assert "{" not in line and "snapshot" not in line
