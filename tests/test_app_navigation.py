"""Navigating like a debugger, driven by Textual's pilot on a database written through the
real store (the generator `tttr bench app` uses): go to, the position indicator, search
matches with n/N, feedback at the ends, bookmarks, copy, export, the detail pane by Tab,
help built from the bindings, and the command palette's own commands."""

from __future__ import annotations

import hashlib
import json

import pytest
from textual.command import CommandList, CommandPalette
from tttr.app.bench import COMMANDS
from tttr.app.palette import palette_commands
from tttr.app.runview import RunView
from tttr.app.screens.ask import AskScreen
from tttr.app.screens.help import HelpScreen
from tttr.app.screens.search import SearchScreen
from tttr.app.screens.timeline import TimelineScreen
from tttr.app.widgets.detail import DetailPane
from tttr.app.widgets.message import MessageStrip
from tttr.app.widgets.timeline import BOOKMARK, Timeline

from tests.app_helpers import SIZE, open_store, two_runs, wait_for
from tests.app_helpers import run_app as _run_app

TOKENS = 12
STEPS = 8


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return two_runs(tmp_path_factory.mktemp("nav") / "session.db", STEPS, TOKENS)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TTTR_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def run_app(db, flow, *, run_id=1, size=SIZE):
    return _run_app(db, flow, run_id=run_id, load_tokenizer=False, size=size)


def notes(app) -> list[str]:
    return [str(n.message) for n in app._notifications]


def test_go_to_an_event_a_step_and_a_site_and_the_position_follows(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        view = timeline.view
        await pilot.press("z", "home")  # every step expanded: one row per event
        assert timeline.border_subtitle == f"event 0/{view.count - 1} · step setup/{STEPS - 1}"
        await pilot.press("colon", *"57", "enter")
        assert timeline.cursor == 57
        step = view.event(57).step
        assert timeline.border_subtitle == f"event 57/{view.count - 1} · step {step}/{STEPS - 1}"
        await pilot.press("end")  # the last event reads as the last, not one short of a count
        assert timeline.border_subtitle == f"event {view.count - 1}/{view.count - 1} · step {STEPS - 1}/{STEPS - 1}"
        await pilot.press("colon", *"s3", "enter")
        assert timeline.cursor == view.step_start(3) and view.event(timeline.cursor - 1).step == 2
        await pilot.press("colon", *"5:tool", "enter")
        assert view.event(timeline.cursor).site == "5:tool"
        await pilot.press("colon", *"-2", "enter")
        assert view.event(timeline.cursor + 2).site == "5:tool"
        await pilot.press("colon", *"setup", "enter")
        assert timeline.cursor == 0
        # a place the run does not have keeps the dialog open with the reason, cursor unmoved
        await pilot.press("colon", *"99999", "enter")
        assert isinstance(app.screen, AskScreen)
        assert "no event 99999" in app.screen.error and f"0–{view.count - 1}" in app.screen.error
        await pilot.press("escape")
        assert isinstance(app.screen, TimelineScreen) and timeline.cursor == 0

    run_app(db, flow)


def test_n_and_N_step_through_the_search_matches_and_wrap(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        view = timeline.view
        await pilot.press("z", "home", "n")
        assert timeline.cursor == 0 and "no search yet: press / to search" in notes(app)
        await pilot.press("slash")
        search = app.screen
        assert isinstance(search, SearchScreen)
        await wait_for(pilot, lambda: search.corpus is not None)
        await pilot.press(*"gzip -k", "enter")
        gzip_steps = [s for s in range(STEPS) if COMMANDS[s % len(COMMANDS)] == "gzip -k app.log"]
        matches = sorted(view.at(f"{s}:{k}").seq for s in gzip_steps for k in ("tool",))
        first = timeline.cursor
        assert first in matches and "gzip" in view.event(first).value["cmd"]
        seen = [first]
        for _ in range(len(matches) - 1):
            await pilot.press("n")
            seen.append(timeline.cursor)
        assert sorted(seen) == matches
        await pilot.press("n")  # past the last: wraps to the first, and says so
        assert timeline.cursor == matches[0] and "search wrapped to the first match" in notes(app)
        await pilot.press("N")
        assert timeline.cursor == matches[-1]
        # `/` again starts from the last query
        await pilot.press("slash")
        assert app.screen.query_one("#search-input").value == "gzip -k"
        await pilot.press("escape")

    run_app(db, flow)


def test_a_move_with_nowhere_to_go_says_so(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        await pilot.press("z", "home", "up")
        assert timeline.cursor == 0 and "at the first row" in notes(app)
        await pilot.press("end", "right")
        assert timeline.cursor == timeline.view.count - 1
        assert "in the last step: no step after it" in notes(app)
        await pilot.press("l", "l", "full_stop")  # the agent layer: the outcome is the last event
        assert any(n.startswith("no agent event after this one") for n in notes(app))

    run_app(db, flow)


def test_bookmarks_toggle_show_in_the_gutter_jump_and_last_the_app_session(db):
    before = hashlib.sha256(db.read_bytes()).hexdigest()

    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        await pilot.press("z", "home", "apostrophe")
        assert any(n.startswith("no bookmarks in this run") for n in notes(app))
        marked = []
        for target in ("10", "40", "s5"):
            await pilot.press("colon", *target, "enter", "m")
            marked.append(timeline.cursor)
        assert timeline.bookmarks == set(marked)
        await pilot.press("colon", *str(marked[0]), "enter")
        await pilot.pause()
        row = timeline.rows.row_of(marked[0]) - timeline.scroll_offset.y
        assert BOOKMARK in timeline.render_line(row).text
        assert BOOKMARK not in timeline.render_line(row + 1).text
        await pilot.press("home", "apostrophe")
        assert timeline.cursor == marked[0]
        await pilot.press("apostrophe", "apostrophe")
        assert timeline.cursor == marked[2]
        await pilot.press("apostrophe")  # wraps
        assert timeline.cursor == marked[0]
        await pilot.press("quotation_mark")
        assert timeline.cursor == marked[2]
        await pilot.press("m")  # unmark
        assert timeline.bookmarks == set(marked[:2])
        # back to the runs and into the run again: the bookmarks are still there
        await pilot.press("escape", "enter")
        assert isinstance(app.screen, TimelineScreen)
        assert app.screen.query_one(Timeline).bookmarks == set(marked[:2])

    run_app(db, flow)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before  # nothing written to the session


def test_copy_puts_the_value_on_the_clipboard_and_in_a_file(db, cache):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        view = timeline.view
        await pilot.press("colon", *"3:clock", "enter", "y")
        assert app.clipboard == view.at("3:clock").value["t"]
        assert (cache / "clipboard.txt").read_text() == app.clipboard
        assert any(str(cache / "clipboard.txt") in n for n in notes(app))
        await pilot.press("colon", *"2:tool", "enter", "y")
        assert app.clipboard == view.at("2:tool").value["stdout"]
        await pilot.press("colon", *"1:token:3", "enter", "y")
        assert app.clipboard == view.at("1:token:3").value["text"]

    run_app(db, flow)


def test_export_writes_the_run_as_json_lines_and_markdown(db, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = hashlib.sha256(db.read_bytes()).hexdigest()

    async def flow(app, pilot):
        view = app.screen.query_one(Timeline).view
        await pilot.press("w")
        assert isinstance(app.screen, AskScreen)
        await pilot.press("enter")  # the offered name: run-1.jsonl
        await wait_for(pilot, lambda: any(n.startswith("exported") for n in notes(app)))
        await pilot.press("w", *["backspace"] * 20, *"run.txt", "enter")
        assert isinstance(app.screen, AskScreen) and ".jsonl" in app.screen.error and ".md" in app.screen.error
        await pilot.press(*["backspace"] * 3, *"md", "enter")
        await wait_for(pilot, lambda: sum(n.startswith("exported") for n in notes(app)) == 2)
        await pilot.press("w", *["backspace"] * 20, *"run.md", "enter")  # exists: refused
        assert isinstance(app.screen, AskScreen) and "exists" in app.screen.error
        await pilot.press("escape")
        return view.count

    count = run_app(db, flow)
    lines = (tmp_path / "run-1.jsonl").read_text().splitlines()
    assert len(lines) == count
    rows = [json.loads(line) for line in lines]
    assert [r["seq"] for r in rows] == list(range(count)) and rows[-1]["kind"] == "outcome"
    md = (tmp_path / "run.md").read_text()
    assert md.startswith("# run 1") and "| seq | step | layer | kind | site | value |" in md
    assert md.count("\n| ") == count + 1 and "gzip -k app.log" in md
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_export_from_a_script_and_from_tttr_events(db, tmp_path, capsys):
    from tttr.app.cli import main
    from tttr.engine.replay.diff import diff_runs
    from tttr.sessions.export import ExportError, export_compare, export_run

    store = open_store(db)
    try:
        n = export_compare(diff_runs(store, 1, 2), tmp_path / "c.jsonl")
        summary, *rows = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()]
        assert summary["what"] == "comparison" and summary["identical"] is False and len(rows) == n
        assert [r["same"] for r in rows].count(False) == 1
        export_compare(diff_runs(store, 1, 2), tmp_path / "c.md")
        assert "rm -rf /var/log/old" in (tmp_path / "c.md").read_text()
        with pytest.raises(ExportError, match="name it .jsonl"):
            export_run(store, 1, tmp_path / "run.csv")
        assert not (tmp_path / "run.csv").exists()
    finally:
        store.close()
    assert main(["events", str(db), "1", "--format", "md", "--limit", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# run 1") and out.count("\n| ") == 5 + 1
    assert main(["events", str(db), "1", "--format", "jsonl", "--limit", "3", "--from", "2"]) == 0
    assert [json.loads(x)["seq"] for x in capsys.readouterr().out.splitlines()] == [2, 3, 4]


def test_tab_reaches_the_detail_pane_and_it_scrolls(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        detail = app.screen.query_one(DetailPane)
        await pilot.press("colon", *"1:logits:2", "enter")  # a logits event: a long detail
        await pilot.pause()
        assert detail.virtual_size.height > detail.scrollable_content_region.height
        await pilot.press("tab")
        assert detail.has_focus
        await pilot.press("down", "down")
        assert detail.scroll_offset.y == 2
        at = timeline.cursor
        await pilot.press("tab", "down")
        assert timeline.has_focus and timeline.cursor == at + 1

    run_app(db, flow, size=(80, 24))


def screen_rows(app) -> list[str]:
    """The screen as the terminal shows it, one string per row."""
    return ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]


def test_a_long_detail_is_not_cut_under_its_scrollbar(db):
    async def flow(app, pilot):
        detail = app.screen.query_one(DetailPane)
        await pilot.press("z", "home", "right")  # step 0's prompt: a detail that fits, no scrollbar
        await pilot.pause()
        assert detail.virtual_size.height <= detail.scrollable_content_region.height
        await pilot.press("down")  # its first token: a detail taller than the pane
        await pilot.pause()
        region = detail.scrollable_content_region
        assert detail.virtual_size.height > region.height  # now its scrollbar shows
        rows = screen_rows(app)
        laid_out = detail.text.splitlines()
        for y in range(region.height):  # every line in view is on screen whole, its last characters too
            assert rows[region.y + y][region.x:region.right].rstrip() == laid_out[y], (y, rows[region.y + y])

    run_app(db, flow, size=(80, 24))


def test_the_message_strip_shrinks_on_a_short_terminal_when_a_step_has_no_tokens(db):
    async def flow(app, pilot):
        strip = app.screen.query_one(MessageStrip)
        heights = [strip.outer_size.height]  # the setup step
        await pilot.press("right")
        await wait_for(pilot, lambda: not strip.has_class("-empty"))
        await pilot.pause()
        return heights + [strip.outer_size.height]

    assert run_app(db, flow, size=(80, 24)) == [3, 6]
    assert run_app(db, flow) == [8, 8]  # a tall terminal: no re-layout when stepping across the setup


def test_help_lists_every_key_of_the_timeline_from_its_bindings(db):
    async def flow(app, pilot):
        await pilot.press("question_mark")
        shown = app.screen.content.plain
        assert isinstance(app.screen, HelpScreen)
        for cls in (TimelineScreen, Timeline, DetailPane):
            for binding in cls.BINDINGS:
                assert binding.description in shown, binding.description
        # d and x are listed on a run that is no fork, marked unavailable
        assert "diff vs parent (not available here now)" in shown
        assert "cancel fork (not available here now)" in shown
        assert "go to event/step/site" in shown and "\n  :" in shown

    run_app(db, flow)


def test_the_command_palette_lists_the_apps_own_commands(db):
    async def flow(app, pilot):
        names = [c.name for c in palette_commands(app.screen)]
        for name in ("Go to event/step/site", "Edit & fork", "Export run", "Bookmark / unbookmark", "Search"):
            assert name in names
        assert "Diff vs parent" not in names  # not a fork: nothing to compare with
        await pilot.press("ctrl+p")
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"go to")
        commands = app.screen.query_one(CommandList)
        await wait_for(pilot, lambda: commands.option_count > 0 and "Go to" in str(commands.get_option_at_index(0).prompt))
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, AskScreen))
        await pilot.press(*"s4", "enter")
        timeline = app.screen.query_one(Timeline)
        assert timeline.view.event(timeline.cursor).step == 4

    run_app(db, flow)


def test_the_palette_on_a_comparison_offers_its_export(db):
    async def flow(app, pilot):
        await pilot.press("escape", "space", "down", "space", "d")
        names = [c.name for c in palette_commands(app.screen)]
        assert "Export this comparison" in names and "Open right" in names

    run_app(db, flow)


def test_at_80x24_the_keys_to_help_and_quit_and_the_run_state_stay_on_screen(db):
    from textual.widgets._footer import FooterKey

    async def flow(app, pilot):
        await pilot.press("right", "full_stop")
        await pilot.pause()
        keys = {k.description: k.region for k in app.screen.query(FooterKey)}
        for words in ("help", "quit", "edit & fork"):
            region = keys[words]
            assert region.width > 0 and region.right <= 80, (words, region)
        title = app.screen.query_one("#run-title")
        assert "complete" in str(title.render()) and title.region.right <= 80
        timeline = app.screen.query_one(Timeline)
        assert timeline.border_subtitle.startswith("event ") and timeline.region.height >= 12

    run_app(db, flow, size=(80, 24))


def test_go_to_answers_and_refusals(db):
    from tttr.app.navigation import goto_target, next_in

    store = open_store(db)
    try:
        view = RunView(store, 1)
        last = view.count - 1
        assert goto_target(view, " 12 ") == 12 and goto_target(view, "$") == last
        assert goto_target(view, "step 2") == goto_target(view, "s2") == view.step_start(2)
        assert goto_target(view, "setup") == 0 and goto_target(view, "-1:clock") == 0
        assert goto_target(view, "+5", cursor=10) == 15 and goto_target(view, "-5", cursor=10) == 5
        for text, reason in (("", "type an event number"), (str(last + 1), f"no event {last + 1}"),
                             ("+1", "outside the run"), ("s99", "no step 99"), ("99:tool", "no event at site"),
                             ("yesterday", "is not a place")):
            with pytest.raises(ValueError, match=reason):
                goto_target(view, text, cursor=last)
    finally:
        store.close()
    assert next_in([], 3) == (None, False)
    assert next_in([2, 5, 9], 5) == (9, False) and next_in([2, 5, 9], 9) == (2, True)
    assert next_in([2, 5, 9], 5, forward=False) == (2, False) and next_in([2, 5, 9], 2, forward=False) == (9, True)


def test_tttr_events_refuses_two_formats_in_one_line(db, capsys):
    from tttr.app.cli import main

    before = hashlib.sha256(db.read_bytes()).hexdigest()
    assert main(["events", str(db), "1", "--json", "--format", "md"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--json and --format md" in err[0]
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before


def test_a_timeline_opened_at_a_step_shows_the_cursor_row(db):
    """What `b` on the compare screen does (app.open_run with a step): the rows scroll to
    the cursor once laid out, and stay there when the message strip changes height."""

    async def flow(app, pilot):
        app.open_run(2, step=6)
        await wait_for(pilot, lambda: isinstance(app.screen, TimelineScreen) and app.screen.view.run_id == 2)
        await pilot.pause()
        timeline = app.screen.query_one(Timeline)
        assert timeline.view.event(timeline.cursor).step == 6 and timeline.on_step_row
        top = timeline.scroll_offset.y
        row = timeline.rows.row_of(timeline.cursor)
        assert top <= row < top + timeline.scrollable_content_region.height
        # back on the setup the strip shrinks; the last row then is a token's, where it grows again
        await pilot.press("z", "home")
        await pilot.pause()
        last_row = timeline.scrollable_content_region.height - 1
        timeline.cursor = last_row
        assert timeline.view.event(last_row).kind in ("token", "logits")
        strip = app.screen.query_one(MessageStrip)
        await wait_for(pilot, lambda: strip.outer_size.height == 6)  # grown: fewer rows for the timeline

        def cursor_in_view():
            top = timeline.scroll_offset.y
            return top <= timeline.cursor < top + timeline.scrollable_content_region.height

        await wait_for(pilot, cursor_in_view, timeout=5)

    run_app(db, flow, size=(80, 24))
