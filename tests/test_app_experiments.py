"""The experiments in the app (issue 17): triage and bisect started from the runs list on a
marked pair, and the stats screen of a suite. The stats screen reads a real SQLite store
holding suite runs as `tttr suite` writes them (tests/test_stats.py builds it); triage runs
for real, on the default model and the real sandbox, on tests/test_triage.py's GOOD/BAD pair."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from tests.app_helpers import run_app, two_runs, wait_for
from tests.test_stats import _store_run, suite_db  # noqa: F401 - suite_db: suite runs in a real store
from tests.test_triage import pair  # noqa: F401 - the fixture: a recorded GOOD/BAD pair
from tttr.app.screens.compare import CompareScreen
from tttr.app.screens.confirm import ConfirmScreen
from tttr.app.screens.runs import RunsScreen
from tttr.app.screens.stats import StatsScreen
from tttr.app.screens.timeline import TimelineScreen
from tttr.app.screens.triage import ExperimentScreen, good_and_bad
from tttr.sessions.store import Store


async def mark(app, pilot, *run_ids):
    """Mark runs on the runs list with space, in this order."""
    table = app.screen.query_one(DataTable)
    for rid in run_ids:
        table.move_cursor(row=table.get_row_index(str(rid)))
        await pilot.pause()
        await pilot.press("space")
        await pilot.pause()
    assert app.screen.marked == list(run_ids)


def cells(table: DataTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


# ---------------------------------------------------------------------------- stats

def test_stats_screen_shows_the_latest_suite_per_task_and_condition_with_its_plot(suite_db):  # noqa: F811
    async def flow(app, pilot):
        await pilot.press("S")
        await wait_for(pilot, lambda: isinstance(app.screen, StatsScreen) and app.screen.stats is not None)
        screen = app.screen
        assert screen.stats.suite_id == "s1"
        rows = {(r[0], r[1]): r for r in cells(screen.query_one(DataTable))}
        free = rows[("make-dir", "free")]
        assert free[2:6] == ["3", "2", "0.67 [0.21,0.94]", "0.33 (1/3)"]
        assert rows[("make-dir", "token-pinned")][6] == "+0.67"
        assert rows[("make-dir", "trace-pinned")][6] == "-0.33"
        assert rows[("make-dir", "pinned")][6] == "residual 0.00" and rows[("make-dir", "pinned")][7] == ""
        assert ("overall", "free") in rows
        plot = screen.plot.plain
        assert "action agreement per condition" in plot and "pass rate, free condition" in plot
        assert "\x1b" not in plot  # plotext's colours became styles, not raw escapes
        await pilot.press("n")  # there is no newer suite: it says so and stays
        await pilot.pause()
        assert screen.stats.suite_id == "s1" and "latest of the 2 suite(s)" in str(list(app._notifications)[-1].message)
        await pilot.press("p")  # the older suite
        await wait_for(pilot, lambda: screen.stats.suite_id == "s0")
        await pilot.press("p")
        await pilot.pause()
        assert screen.stats.suite_id == "s0" and "oldest of the 2 suite(s)" in str(list(app._notifications)[-1].message)
        assert [r[0] for r in cells(screen.query_one(DataTable))] == ["old", "overall"]
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)

    run_app(suite_db, flow, load_tokenizer=False)


def test_on_a_60_column_terminal_the_stats_plot_fits_its_pane(suite_db):  # noqa: F811
    async def flow(app, pilot):
        await pilot.press("S")
        await wait_for(pilot, lambda: isinstance(app.screen, StatsScreen) and app.screen.stats is not None)
        await pilot.pause()
        pane = app.screen.query_one("#stats-plot")
        lines = app.screen.plot.plain.splitlines()
        assert any("action agreement per condition" in ln for ln in lines)
        assert max(len(ln) for ln in lines) <= pane.content_size.width  # no bar wraps onto a line of its own
        return pane.content_size.width

    assert run_app(suite_db, flow, load_tokenizer=False, size=(60, 24)) < 60


def test_a_residual_under_full_pinning_is_said_on_its_row(tmp_path):
    db = tmp_path / "residual.db"
    with Store.open(db) as store:
        for i, cmds in enumerate([["mkdir b"], ["mkdir c"]]):
            _store_run(store, "make-dir", "pinned", i, True, cmds)

    async def flow(app, pilot):
        await pilot.press("S")
        await wait_for(pilot, lambda: isinstance(app.screen, StatsScreen) and app.screen.stats is not None)
        row = cells(app.screen.query_one(DataTable))[0]
        assert row[:2] == ["make-dir", "pinned"] and row[6] == "residual 1.00" and row[7].startswith("NOT ZERO")

    run_app(db, flow, load_tokenizer=False)


def test_a_hostile_task_name_is_shown_as_text_in_the_table_and_the_plot(tmp_path):
    db = tmp_path / "hostile.db"
    name = "[bold red]x\x1b[31my"
    with Store.open(db) as store:
        for i in range(2):
            _store_run(store, name, "free", i, True, ["mkdir b"])

    async def flow(app, pilot):
        await pilot.press("S")
        await wait_for(pilot, lambda: isinstance(app.screen, StatsScreen) and app.screen.stats is not None)
        assert cells(app.screen.query_one(DataTable))[0][0] == "[bold red]x\\x1b[31my"
        plot = app.screen.plot.plain
        assert "\x1b" not in plot and "x\\x1b[31m" in plot  # the escape is shown, not obeyed

    run_app(db, flow, load_tokenizer=False)


def test_stats_on_a_database_without_suite_runs_says_how_to_record_them(tmp_path):
    db = two_runs(tmp_path / "plain.db", steps=2, tokens=2)

    async def flow(app, pilot):
        await pilot.press("S")
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)
        said = [n.message for n in app._notifications]
        assert any("holds no suite runs" in m and "tttr suite --runs N" in m for m in said), said

    run_app(db, flow, load_tokenizer=False)


# ---------------------------------------------------------------------------- refusals

@pytest.fixture
def plain_pair(tmp_path):
    """Complete runs, as a store holds them: two identical runs of one task, one of another."""
    db = tmp_path / "pair.db"
    with Store.open(db) as store:
        ids = []
        for task, passed in (("make-dir", True), ("make-dir", False), ("write-line", False)):
            rid = store.begin_run(task=task, model_id="m", kernel_mode="invariant", seed=1)
            store.finish_run(rid, "complete", {"passed": passed})
            ids.append(rid)
    return db, ids


def test_the_marked_run_that_passed_is_good(plain_pair):
    db, (passed, failed, other) = plain_pair
    with Store.open(db, create=False, readonly=True) as store:
        assert good_and_bad(store.run(failed), store.run(passed)) == (passed, failed, "outcome")
        assert good_and_bad(store.run(failed), store.run(other)) == (failed, other, "actions")


@pytest.mark.parametrize("key,runs,refusal", [
    ("T", (0, 2), "have different tasks (write-line and make-dir)"),  # as tttr triage says it: BAD's first
    ("B", (1, 0), "do not differ at any clock"),
])
def test_a_refused_pair_is_one_line_and_nothing_else(plain_pair, key, runs, refusal):
    db, ids = plain_pair
    before = db.read_bytes()

    async def flow(app, pilot):
        await pilot.press("T")  # nothing marked: a hint, no screen
        await pilot.pause()
        assert isinstance(app.screen, RunsScreen)
        assert any("mark two runs" in n.message for n in app._notifications)
        await mark(app, pilot, *(ids[i] for i in runs))
        await pilot.press(key)
        await wait_for(pilot, lambda: isinstance(app.screen, ExperimentScreen) and app.screen.error is not None)
        screen = app.screen
        assert refusal in screen.error and "\n" not in screen.error
        assert screen.verdict == [] and not screen.query_one(DataTable).display
        assert not screen.query_one("#experiment-progress").display

    run_app(db, flow, load_tokenizer=False)
    assert db.read_bytes() == before  # a refusal writes nothing


def test_triage_replays_finishing_out_of_order_are_said_as_they_finish_and_listed_in_the_layers_order(
        tmp_path, monkeypatch):
    """Side by side, the trace layer's replay can finish before the token layer's: the progress
    says each as it comes, the table lists them tensor, token, trace. The experiment itself is
    stood in for (its replays are tested in tests/test_triage.py); the screen is what is tested."""
    from tests.test_program_triage import program_run
    from tttr.engine.program import triage as program_triage
    from tttr.engine.replay.deltas import Delta
    from tttr.engine.replay.triage import BATCHED, LayerResult, Triage
    from tttr.engine.replay.trial import Trial

    db = tmp_path / "programs.db"
    with Store.open(db) as store:
        good, bad = program_run(store), program_run(store, result="rain", tokens=(10, 13, 14), passed=False)

    def side_by_side(db, good, bad, *, on_layer, **_):
        token = LayerResult("token", [Delta("1:token:1", "token", 13, 11)],
                            Trial(8, [], [], False, [], True, {"status": "complete"}))
        trace = LayerResult("trace", [Delta("2:tool", "trace", "rain", "sunny")],
                            Trial(7, [], [], True, [], False, {"status": "complete"}))
        tensor = LayerResult("tensor", [], None)
        for r in (tensor, trace, token):  # as they finished
            on_layer(r)
        return Triage(good, bad, "outcome", [tensor, token, trace], batched=True, batch_note=BATCHED)

    monkeypatch.setattr(program_triage, "prepare", lambda *a, **kw: None)  # the check: GOOD's replay and all
    monkeypatch.setattr(program_triage, "triage", side_by_side)

    async def flow(app, pilot):
        await mark(app, pilot, good, bad)
        await pilot.press("T")
        screen = app.screen
        await wait_for(pilot, lambda: isinstance(screen, ExperimentScreen) and (screen.verdict or screen.error))
        assert screen.error is None, screen.error
        said = [line.split(":")[0] for line in screen.lines if not line.endswith("…")]  # after what it starts
        assert said == ["tensor", "trace", "token"]
        assert [t.run_id for t in screen.tested] == [8, 7]  # token, then trace
        assert [row[0] for row in cells(screen.query_one(DataTable))] == ["#8", "#7"]
        assert screen.verdict == ["verdict: the trace layer: BAD with GOOD's trace values no longer fails",
                                  f"replays: 2 ({BATCHED})"]

    run_app(db, flow, load_tokenizer=False)


# ---------------------------------------------------------------------------- triage, for real

@pytest.mark.slow
def test_triage_and_bisect_from_the_runs_list_name_the_layer_and_the_clock_and_link_their_replays(pair):  # noqa: F811
    db, good, bad, first, last = pair

    async def flow(app, pilot):
        await mark(app, pilot, bad, good)  # marked BAD first: the run that passed is GOOD all the same
        app._runtime_lock.acquire()  # the worker waits for the model here until released below
        try:
            await pilot.press("T")
            assert isinstance(app.screen, ExperimentScreen)
            screen = app.screen
            assert (screen.good, screen.bad, screen.judge) == (good, bad, "outcome")
            await wait_for(pilot, lambda: "loading the model …" in screen.lines)
            await pilot.press("q")  # quitting while it runs asks first
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n")
            assert app.screen is screen and not screen.cancel.is_set()  # it goes on
        finally:
            app._runtime_lock.release()
        await wait_for(pilot, lambda: screen.verdict or screen.error, timeout=900)
        assert screen.error is None, screen.error
        assert screen.verdict[0].startswith("verdict: the trace layer")
        assert "token: no differences, not replayed" in screen.lines
        assert any(line.startswith("trace: 2 delta(s) from GOOD") for line in screen.lines)
        (replay,) = screen.tested
        assert replay.replayed == bad and replay.outcome == "passed" and replay.judged == "fixed"
        assert f"{first}:clock" in replay.what and f"{last}:clock" in replay.what
        table = screen.query_one(DataTable)
        assert table.display and cells(table)[0][0] == f"#{replay.run_id}"

        await pilot.press("enter")
        assert isinstance(app.screen, TimelineScreen) and app.screen.view.run_id == replay.run_id
        await pilot.press("escape")
        await pilot.press("c")
        assert isinstance(app.screen, CompareScreen)
        assert (app.screen.run_a, app.screen.run_b) == (bad, replay.run_id)
        await pilot.press("escape")
        await pilot.press("C")
        assert (app.screen.run_a, app.screen.run_b) == (good, replay.run_id)

        await pilot.press("escape", "escape")  # compare → triage → runs, the pair still marked
        assert isinstance(app.screen, RunsScreen) and app.screen.marked == [bad, good]
        await pilot.press("B")
        screen = app.screen
        await wait_for(pilot, lambda: screen.verdict or screen.error, timeout=900)
        assert screen.error is None, screen.error
        assert screen.verdict[0] == "minimal failure-inducing set: 1 delta(s), layer(s) trace"
        assert screen.verdict[1].startswith(f"  {last}:clock (trace)")
        assert [t.judged for t in screen.tested] == ["fails", "does not fail", "fails"]
        assert all(t.replayed == good for t in screen.tested) and any(line.startswith("round 1") for line in screen.lines)

        await pilot.press("escape")
        runs_before = len(app.store.runs())
        app._runtime_lock.acquire()
        try:
            await pilot.press("T")
            screen = app.screen
            await wait_for(pilot, lambda: "loading the model …" in screen.lines)
            await pilot.press("x")  # cancelled before its first replay: it stops after checking the pair
        finally:
            app._runtime_lock.release()
        await wait_for(pilot, lambda: screen.verdict or screen.error, timeout=900)
        assert screen.verdict[0].startswith("cancelled") and screen.cancel is None
        assert screen.tested == [] and not screen.query_one(DataTable).display
        assert len(app.store.runs()) == runs_before  # it stored no replay
        return replay.run_id

    replay_id = run_app(db, flow, load_tokenizer=False)
    with Store.open(db, create=False, readonly=True) as store:  # stored through the worker's own connection
        replay = store.run(replay_id)
        assert replay.parent == bad and replay.status == "complete" and replay.outcome["passed"] is True
