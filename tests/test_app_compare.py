"""The compare screen's loading, on generated runs written through the real store (the
generator `tttr bench app` uses) and a hand-made fork of one: the quick scan it uses names
what `tttr diff` names, the screen shows a loading state with progress and then its rows,
and `escape` while it loads goes back at once and stops the worker."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from tests.app_helpers import open_store, run_app, two_runs, wait_for
from tttr.app.screens.compare import CompareScreen
from tttr.app.widgets.side_by_side import SideBySide
from tttr.engine.replay.diff import ScanCancelled, diff_runs, scan_runs
from tttr.sessions.errors import StoreError
from tttr.sessions.store import Store


def _fork(path, parent: int, at: str, mutation=None) -> int:
    """A child of `parent` as a fork writes one: the parent's events before `at` shared,
    then its own — the token at `at` replaced (a JSON record, as a mutated token is stored),
    one later clock moved, the rest copied."""
    with Store.open(path) as store:
        start = store.event_at(parent, at).seq
        later = store.events(parent, start)
        child = store.begin_run(task="rotate-logs", model_id="synthetic-bench", seed=9, parent=parent,
                                fork_site=at, mutation=mutation or {"value": 7})
        step = later[0].step
        for e in later:
            if e.step != step:
                store.commit_step(child)
                step = e.step
            value = e.value
            if e.site == at:
                value = {"id": 7, "text": " seven", "forced": True, "logprob": 0.0, "rng": [9, e.step, 0],
                         "mutated": True}
            elif e.kind == "clock" and e.step == step and e.step == later[-1].step:
                value = {"t": "2027-01-01T00:00:00"}
            store.append(child, e.site, value)
        store.commit_step(child)
        store.finish_run(child, "complete", {"passed": False})
    return child


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = two_runs(tmp_path_factory.mktemp("compare") / "s.db", steps=4, tokens=12)
    _fork(path, 1, "1:token:3")
    return path


def test_the_quick_scan_names_what_tttr_diff_names(db):
    store = open_store(db)
    try:
        for a, b in ((1, 2), (2, 1), (1, 3), (3, 1), (2, 3), (1, 1)):
            assert scan_runs(store, a, b).to_json() == diff_runs(store, a, b).to_json(), (a, b)
        fork = diff_runs(store, 1, 3)
        assert fork.first_divergence["token"].site == "1:token:3" and fork.first_divergence["token"].b == 7
        assert fork.first_divergence["trace"].b == "2027-01-01T00:00:00"
        reports = []
        scan_runs(store, 1, 2, progress=lambda done, total: reports.append((done, total)))
        assert reports and reports[-1][0] == reports[-1][1] == store.count_events(1) + store.count_events(2)
        with pytest.raises(ScanCancelled):
            scan_runs(store, 1, 2, cancelled=lambda: True)
    finally:
        store.close()


def test_the_quick_scan_refuses_an_unreadable_value_as_tttr_diff_does(tmp_path):
    path = two_runs(tmp_path / "s.db", steps=2, tokens=4)
    with sqlite3.connect(path) as conn:  # one token of run 2 stored as JSON whose id is text
        conn.execute("UPDATE events SET value = ? WHERE id = (SELECT min(id) FROM events WHERE id >> 32 = 2"
                     " AND kind = (SELECT code FROM kinds WHERE kind = 'token'))",
                     ('{"id": "seventeen", "text": "x"}',))
    store = open_store(path)
    try:
        with pytest.raises(StoreError) as quick:
            scan_runs(store, 1, 2)
        with pytest.raises(StoreError) as full:
            diff_runs(store, 1, 2)
        assert str(quick.value) == str(full.value) and "run 2, site 0:token:0" in str(quick.value)
    finally:
        store.close()


@pytest.fixture
def held(monkeypatch):
    """The compare's scan waits for `release` before it runs (the real scan, then), so a
    test sees the loading state however fast the machine is; `outcome` says how it ended."""
    release, outcome = threading.Event(), []

    def scan(*args, **kwargs):
        release.wait(30)
        try:
            result = scan_runs(*args, **kwargs)
        except ScanCancelled:
            outcome.append("cancelled")
            raise
        outcome.append("done")
        return result

    monkeypatch.setattr("tttr.app.compare.scan_runs", scan)
    return release, outcome


def test_the_compare_shows_a_loading_state_then_its_rows(db, held):
    release, outcome = held

    async def flow(app, pilot):
        screen = CompareScreen(1, 2)
        app.push_screen(screen)
        await pilot.pause()
        assert screen.query_one("#compare-progress").display and not screen.query_one(SideBySide).display
        assert "comparing run #1 with run #2" in str(screen.query_one("#compare-loading").render())
        assert screen.comparison is None
        release.set()
        await wait_for(pilot, lambda: screen.comparison is not None)
        await pilot.pause()
        assert not screen.query_one("#compare-progress").display and screen.query_one(SideBySide).display
        side = screen.query_one(SideBySide)
        assert [r.same for r in side.rows].count(False) >= 1  # step 2's other command
        assert "aligned rows differ" in str(screen.query_one("#compare-summary").render())
        await pilot.press("n")  # the compare's keys answer once loaded
        assert screen.query_one(SideBySide).rows[side.cursor].same is False

    run_app(db, flow, load_tokenizer=False)
    assert outcome == ["done"]


def test_escape_while_the_compare_loads_goes_back_and_stops_the_worker(db, held):
    release, outcome = held

    async def flow(app, pilot):
        before = app.screen
        screen = CompareScreen(1, 3)
        app.push_screen(screen)
        await pilot.pause()
        assert app.screen is screen and screen.comparison is None
        await pilot.press("escape")
        assert app.screen is before
        release.set()
        await wait_for(pilot, lambda: bool(outcome))
        await pilot.pause(0.1)
        assert app.screen is before and screen.comparison is None  # nothing pushed, nothing shown
        assert not [w for w in app.workers if w.name == "diff" and w.is_running]

    run_app(db, flow, load_tokenizer=False)
    assert outcome == ["cancelled"]


def test_bench_app_measures_the_compare_of_two_generated_runs():
    """`tttr bench app --json` (here on 2,000-event runs): the timeline's figures and the
    compare's, from the real app driven headless."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-m", "tttr.app", "bench", "app", "--events", "2000", "--runs", "300",
                          "--json"],
                         cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout)
    assert figures["events"] >= 1900 and figures["open_s"] > 0 and figures["keypress_ms"] > 0
    assert figures["compare_open_s"] > 0 and figures["compare_open_cpu_s"] > 0
    assert figures["compare_rows"] >= 4 and figures["compare_keypress_ms"] > 0
    assert figures["runs_list_ms"] > 0  # the runs list's first paint, on --runs runs


def test_help_on_the_compare_lists_its_keys_and_the_palette(db):
    async def flow(app, pilot):
        screen = CompareScreen(1, 2)
        app.push_screen(screen)
        await wait_for(pilot, lambda: screen.comparison is not None)
        await pilot.press("question_mark")
        shown = app.screen.content.plain
        for cls in (CompareScreen, SideBySide):
            for binding in cls.BINDINGS:
                assert (binding.description or binding.action.split("(")[0]) in shown, binding
        assert "back to runs" in shown and "ctrl+p" in shown and "command palette" in shown

    run_app(db, flow, load_tokenizer=False)


def test_on_a_narrow_terminal_the_right_half_ends_in_view_not_under_the_scrollbar(db):
    async def flow(app, pilot):
        screen = CompareScreen(1, 2)
        app.push_screen(screen)
        await wait_for(pilot, lambda: screen.comparison is not None)
        await pilot.pause()
        side = screen.query_one(SideBySide)
        region = side.scrollable_content_region
        assert side.virtual_size.height > region.height  # its scrollbar shows
        rows = ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]
        for y in range(region.height):  # what each line draws is on screen whole: a cut half ends in …
            drawn = side.render_line(y).text.rstrip()
            assert rows[region.y + y][region.x:region.right].rstrip() == drawn, (y, drawn)
        assert any(row[region.x:region.right].rstrip().endswith("…") for row in rows[region.y:region.bottom])

    run_app(db, flow, load_tokenizer=False, size=(60, 24))


def test_at_80x24_every_screen_keeps_help_and_quit_in_its_footer(db):
    from textual.widgets._footer import FooterKey

    from tttr.app.screens.runs import RunsScreen
    from tttr.app.screens.timeline import TimelineScreen

    def shown(app) -> dict[str, object]:
        return {k.description: k.region for k in app.screen.query(FooterKey) if k.region.width > 0}

    async def flow(app, pilot):
        seen = []
        for screen in (RunsScreen, TimelineScreen, CompareScreen):
            if screen is TimelineScreen:
                app.open_run(3)  # a fork: its timeline has a key more than a recorded run's
            elif screen is CompareScreen:
                await pilot.press("d")  # the fork beside its parent
                await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.comparison)
            await pilot.pause()
            assert isinstance(app.screen, screen)
            keys = shown(app)
            for words in ("help", "quit"):
                assert words in keys and keys[words].right <= 80, (screen.__name__, words, keys)
            seen.append(screen)
        return seen

    assert len(run_app(db, flow, load_tokenizer=False, size=(80, 24))) == 3


def test_on_a_narrow_terminal_the_title_names_both_runs_however_long_the_forks_value(tmp_path):
    path = two_runs(tmp_path / "s.db", steps=4, tokens=12)
    typed = '["README", "greeting.txt", "notes.md", "a file with a long name.txt"]'
    child = _fork(path, 1, "1:token:3", {"site": "1:token:3", "input": typed, "value": 7})

    async def flow(app, pilot):
        screen = CompareScreen(1, child)
        app.push_screen(screen)
        await wait_for(pilot, lambda: screen.comparison is not None)
        await pilot.pause()
        title = screen.query_one("#compare-title")
        shown = "".join(seg.text for seg in app.screen._compositor.render_strips()[title.region.y])
        assert "left: #1" in shown and f"right: #{child}" in shown and shown.rstrip().endswith("fail"), shown

    run_app(path, flow, load_tokenizer=False, size=(60, 24))


def test_a_token_divergence_reads_as_text_with_its_id_beside_it(db, capsys):
    """Found by the diff, a token divergence carries both runs' token texts (read from the
    token events it decoded anyway): `tttr diff` prints each beside its id, never a bare id."""
    from tttr.app import describe
    from tttr.app.cli import main
    from tttr.engine.replay.diff import Divergence

    store = open_store(db)
    try:
        d = diff_runs(store, 1, 2).first_divergence["token"]
        texts = [store.event_at(run, d.site).value["text"] for run in (1, 2)]
    finally:
        store.close()
    line = (f"{d.site} (token layer): a {describe.token_text(texts[0])} ({d.a}), "
            f"b {describe.token_text(texts[1])} ({d.b})")
    assert d.describe() == line and d.texts == tuple(texts)
    capsys.readouterr()
    assert main(["diff", "1", "2", "--db", str(db)]) == 0
    assert line in " ".join(capsys.readouterr().out.split()), line
    assert describe.token_with_id(None, 93) == "93"
    # A token's text is untrusted: controls escaped, markup left as text; cut when long.
    hostile = Divergence("0:token:0", "token", 5, 6, ("recorded", "live"), texts=("\x1b[2J[bold]x\u202e", "y" * 500))
    said = hostile.describe()
    assert "\x1b" not in said and "\u202e" not in said and "[bold]x" in said and len(said) < 200, said
    assert said.startswith('0:token:0 (token layer): recorded "\\u001b[2J[bold]x\\u202e" (5), live "yyy') and \
        said.endswith('…" (6)'), said
