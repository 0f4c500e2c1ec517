"""The runs screen as a place to manage runs: forks as a tree under their parent, names,
deleting with confirmation, cancelled forks in plain words, quitting while a fork runs,
and a run that is still being recorded growing on screen while a real recorder writes
it through the store. Databases are written through the real store; the app opens them
read-only, as `tttr open` does."""

from __future__ import annotations

import shutil
import threading

import pytest

from tttr.app.screens.ask import AskScreen
from tttr.app.screens.confirm import ConfirmScreen
from tttr.app.screens.runs import RunsScreen
from tttr.app.screens.timeline import TimelineScreen
from tttr.app.widgets.fork_progress import ForkProgress
from tttr.app.widgets.timeline import Timeline
from tttr.sessions import schema
from tttr.sessions.store import Store

from tests.app_helpers import hold_forks, open_store, run_app, wait_for
from test_app_fork import demo_db  # noqa: F401 - a fixture: `tttr demo` records a real run
from test_store import SEED, record, record_step, token

CANCELLED = {"reason": "cancelled"}  # what the oracle stores for a fork stopped by the user


def build(path) -> dict[str, int]:
    """A parent; a fork of it (two steps of its own); a fork of the fork that was cancelled;
    a replay of the parent; an unrelated run."""
    with Store.open(path) as store:
        parent = record(store, steps=4)
        fork = store.begin_run(task="t", parent=parent, fork_site="2:token:3",
                               mutation={"site": "2:token:3", "input": "x", "value": 999}, seed=SEED)
        store.append(fork, "2:token:3", token(2, 3, tid=999))
        store.commit_step(fork)
        record_step(store, fork, 3, positions=2)
        store.finish_run(fork, "complete", {"passed": False, "checker_exit": 1, "checker_output": "no"})
        cancelled = store.begin_run(task="t", parent=fork, fork_site="3:clock",
                                    mutation={"site": "3:clock", "input": "+1d", "value": "2026-11-30T10:03:00"},
                                    seed=SEED)
        store.append(cancelled, "3:clock", {"t": "2026-11-30T10:03:00"})
        store.commit_step(cancelled)
        store.finish_run(cancelled, "incomplete", CANCELLED)
        replay = store.begin_run(task="t", parent=parent, fork_seq=0, meta={"replay": {"free": ["tensor"]}}, seed=SEED)
        record_step(store, replay, 0, positions=1)
        store.finish_run(replay, "complete", {"passed": True})
        other = record(store, steps=2)
    return {"parent": parent, "fork": fork, "cancelled": cancelled, "replay": replay, "other": other}


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "runs.db"
    return path, build(path)


def rows(app) -> list[list[str]]:
    table = app.screen.query_one("#runs")
    return [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]


def column(app, name: str) -> list[str]:
    from tttr.app.screens.runs import COLUMNS

    return [row[COLUMNS.index(name)] for row in rows(app)]


async def cursor_to(app, pilot, run_id: int) -> None:
    table = app.screen.query_one("#runs")
    table.move_cursor(row=table.get_row_index(str(run_id)))
    await pilot.pause()


def test_forks_are_a_tree_under_their_parent_and_a_cancelled_fork_says_so(db):
    path, ids = db

    async def flow(app, pilot):
        assert column(app, "run") == ["#1", "├─ #2", "│  └─ #3", "└─ #4", "#5"]
        outcomes = dict(zip(column(app, "run"), column(app, "outcome")))
        assert outcomes["│  └─ #3"] == "cancelled"  # in words, not {"reason": "cancelled"}
        assert not any("{" in cell for cell in column(app, "outcome"))
        assert column(app, "status")[2] == "incomplete"
        lineage = column(app, "lineage")
        assert lineage[1] == "fork of #1 at 2:token:3 = x → 999" and lineage[3].startswith("replay of #1")

    run_app(path, flow, load_tokenizer=False)


def test_a_triage_replay_reads_as_the_deltas_it_took_said_once(tmp_path):
    path = tmp_path / "triage.db"
    with Store.open(path) as store:  # as a triage or bisect stores its replay of BAD with deltas from GOOD
        good, bad = record(store, steps=4), record(store, steps=4)
        store.begin_run(task="t", parent=bad, fork_site="2:token:3", seed=SEED,
                        mutation={"site": "2:token:3", "value": "2 deltas",
                                  "input": f"2 deltas from run {good}: 2:token:3, 3:clock",
                                  "deltas": ["2:token:3", "3:clock"]})

    async def flow(app, pilot):
        lineage = column(app, "lineage")[-1]
        assert lineage == f"fork of #{bad} at 2:token:3 = 2 deltas from run {good}: 2:token:3, 3:clock", lineage

    run_app(path, flow, load_tokenizer=False)


def test_recorded_programs_read_as_their_command_lines_their_forks_too(tmp_path):
    path = tmp_path / "programs.db"
    with Store.open(path) as store:  # as `tttr record` stores them: every program's task is `program:python3`
        runs = [store.begin_run(task="program:python3", meta={"source": "tttr record", "program": ["python3", name]})
                for name in ("openai_agent.py", "langgraph_agent.py")]
        store.begin_run(task="program:python3", parent=runs[0], fork_seq=0,
                        meta={"check": "sh check.sh"})  # a fork, as a program's stores it: no command line

    async def flow(app, pilot):
        assert column(app, "task") == ["python3 openai_agent.py", "python3 openai_agent.py",
                                       "python3 langgraph_agent.py"]

    run_app(path, flow, load_tokenizer=False)


def test_at_80_columns_a_timelines_title_shows_the_runs_state_before_its_long_model_name(tmp_path):
    path = tmp_path / "long.db"
    with Store.open(path) as store:
        rid = store.begin_run(task="program:python3", model_id="SmolLM2-135M-Instruct.Q4_1-0ba7c6f96872",
                              kernel_mode="invariant", seed=SEED)
        record_step(store, rid, 0)
        store.finish_run(rid, "complete", {"passed": False, "checker_exit": 1, "checker_output": "no"})

    async def flow(app, pilot):
        title = app.screen.query_one("#run-title")
        shown = "".join(seg.text for seg in app.screen._compositor.render_strips()[title.region.y])
        assert f"run #{rid}  complete fail" in shown and "SmolLM2" in shown, shown

    run_app(path, flow, run_id=rid, load_tokenizer=False, size=(80, 24))


def test_a_run_is_named_and_a_fork_deleted_with_confirmation(db):
    path, ids = db
    with Store.open(path, readonly=True) as store:
        kept = {r: [(e.seq, e.site, e.value) for e in store.events(r)] for r in (ids["parent"], ids["other"])}
        fork_seq = store.run(ids["fork"]).fork_seq
        fork_prefix = [(e.seq, e.site, e.value) for e in store.events(ids["fork"])][:fork_seq]

    async def flow(app, pilot):
        await cursor_to(app, pilot, ids["fork"])
        await pilot.press("n")
        assert isinstance(app.screen, AskScreen)
        await pilot.press(*"clock fork", "enter")
        assert isinstance(app.screen, RunsScreen)
        assert column(app, "run")[1] == "├─ #2 clock fork"
        assert app.screen._current() == ids["fork"]  # the cursor stayed on the run
        # A run with forks is refused before anything is asked.
        await pilot.press("x")
        assert isinstance(app.screen, RunsScreen) and len(rows(app)) == 5
        # The cancelled fork: asked first; no keeps it.
        await cursor_to(app, pilot, ids["cancelled"])
        await pilot.press("x")
        assert isinstance(app.screen, ConfirmScreen)
        assert "events it shares with run #2 stay with that run" in app.screen.question.plain
        await pilot.press("n")
        assert isinstance(app.screen, RunsScreen) and len(rows(app)) == 5
        await pilot.press("x")
        await pilot.press("y")
        assert isinstance(app.screen, RunsScreen)
        assert column(app, "run") == ["#1", "├─ #2 clock fork", "└─ #4", "#5"]
        # Now the fork has no forks of its own: it goes too, and what the session kept by its
        # id (bookmarks, rebuilt prompts) goes with it: the id may be given to a later run.
        app.bookmarks[ids["fork"]] = {3}
        app._prompts[ids["fork"]] = "kept"
        await cursor_to(app, pilot, ids["fork"])
        await pilot.press("delete", "y")
        assert column(app, "run") == ["#1", "└─ #4", "#5"]
        assert ids["fork"] not in app.bookmarks and ids["fork"] not in app._prompts

    run_app(path, flow, load_tokenizer=False)
    # The .db file alone (copied without its -wal) holds the change: the writer checkpointed.
    copy = path.parent / "copy.db"
    shutil.copyfile(path, copy)
    with Store.open(copy, readonly=True) as store:
        assert [r.id for r in store.runs()] == [ids["parent"], ids["replay"], ids["other"]]
        assert {r: [(e.seq, e.site, e.value) for e in store.events(r)] for r in kept} == kept
        # the events the fork shared are the parent's still
        assert [(e.seq, e.site, e.value) for e in store.events(ids["parent"])][:fork_seq] == fork_prefix
        assert store.check() == []


def test_a_bad_name_keeps_the_dialog_open_with_the_reason(db):
    path, ids = db

    async def flow(app, pilot):
        await pilot.press("n")
        dialog = app.screen
        assert isinstance(dialog, AskScreen)
        await pilot.press("enter")  # empty
        assert app.screen is dialog and "is empty" in dialog.error
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)

    run_app(path, flow, load_tokenizer=False)
    with open_store(path) as store:
        assert [r.name for r in store.runs()] == [None] * 5


def test_quitting_while_a_fork_runs_asks_first(db):
    path, ids = db

    async def flow(app, pilot):
        await pilot.press("enter")  # the parent's timeline
        assert isinstance(app.screen, TimelineScreen)
        bar = app.screen.query_one(ForkProgress)
        bar.start("3:clock", "+1d")  # what the screen shows while its fork worker runs
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen) and "fork is still running" in app.screen.question.plain
        await pilot.press("n")
        assert isinstance(app.screen, TimelineScreen) and app.is_running
        bar.stop()
        await pilot.press("q")  # nothing running: no question
        await wait_for(pilot, lambda: not app.is_running)
        return True

    assert run_app(path, flow, load_tokenizer=False)


def test_a_run_being_recorded_grows_on_screen_until_it_finishes(tmp_path):
    """A recorder in another thread forks run 1 and writes the fork through its own store
    connection, one step at a time when the test says so; the app follows it on the runs
    list (the new row goes under its parent, the cursor stays on its run) and the timeline."""
    path = tmp_path / "live.db"
    with Store.open(path) as store:
        record(store, steps=1)  # run 1: 13 events in step 0
        record(store, steps=1)  # run 2
    started, step, finish, done = threading.Event(), threading.Semaphore(0), threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def recorder():
        try:
            with Store.open(path) as store:
                rid = store.begin_run(task="live", model_id="m", kernel_mode="invariant", seed=SEED, parent=1,
                                      fork_seq=store.count_events(1), mutation={"site": "1:clock", "input": "+1d"})
                record_step(store, rid, 1, positions=2)  # 7 events a step
                started.set()
                for s in range(2, 4):
                    step.acquire()
                    record_step(store, rid, s, positions=2)
                finish.wait()
                store.finish_run(rid, "complete", {"passed": True})
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failures.append(exc)
        finally:
            done.set()

    async def flow(app, pilot):
        await cursor_to(app, pilot, 2)
        assert column(app, "run") == ["#1", "#2"]
        writer = threading.Thread(target=recorder, daemon=True)
        writer.start()
        await wait_for(pilot, lambda: started.is_set())
        await wait_for(pilot, lambda: len(rows(app)) == 3)
        assert column(app, "run") == ["#1", "└─ #3", "#2"] and app.screen._current() == 2
        assert column(app, "status")[1] == "recording" and column(app, "steps")[1] == "2"
        assert "recording: #3" in str(app.screen.query_one("#runs-title").render())
        step.release()
        await wait_for(pilot, lambda: column(app, "steps")[1] == "3")
        assert app.screen._current() == 2
        # Open the live run: its timeline grows as steps are committed, the cursor stays.
        await cursor_to(app, pilot, 3)
        await pilot.press("enter")
        screen = app.screen
        assert isinstance(screen, TimelineScreen)
        timeline = screen.query_one(Timeline)
        assert timeline.view.count == 13 + 2 * 7 and "recording" in str(screen.query_one("#run-title").render())
        await pilot.press("z", "home", "down", "down", "down")  # every step expanded, new ones too
        assert timeline.cursor == 3
        step.release()
        await wait_for(pilot, lambda: timeline.view.count == 13 + 3 * 7)
        assert timeline.cursor == 3 and timeline.virtual_size.height == 13 + 3 * 7
        timeline.cursor = timeline.view.count - 1  # the new rows are there to move to
        await pilot.pause()
        assert timeline.view.event(timeline.cursor).site == "3:tool"
        finish.set()
        await wait_for(pilot, lambda: done.is_set())
        await wait_for(pilot, lambda: "complete" in str(screen.query_one("#run-title").render()))
        assert "recording" not in str(screen.query_one("#run-title").render())
        await pilot.press("escape")
        await wait_for(pilot, lambda: column(app, "status")[1] == "complete")
        assert column(app, "steps")[1] == "4" and column(app, "outcome")[1] == "pass"

    run_app(path, flow, load_tokenizer=False)
    assert not failures, failures


@pytest.mark.slow  # records with the default model (test_app_fork's `tttr demo` fixture), then forks from the app
def test_quitting_mid_fork_asks_and_the_fork_is_listed_as_cancelled(demo_db, monkeypatch):  # noqa: F811
    """End to end: a real recording, a real fork started from the edit dialog, `q` while it
    runs; after yes, the fork stops at its step and the runs list says `cancelled`. The fork
    is held at its first progress report until the flow has quit, so a fast machine cannot
    finish it between the key presses."""
    from tttr.app.screens.edit import EditScreen

    db, run_id = demo_db
    held = hold_forks(monkeypatch)

    async def fork_then_quit(app, pilot):
        timeline = app.screen.query_one(Timeline)
        timeline.cursor = timeline.view.at("0:token:0").seq
        await pilot.pause()
        await pilot.press("e")
        assert isinstance(app.screen, EditScreen)
        await pilot.press("down", "enter")  # the second recorded alternative: the fork starts
        screen = app.screen
        assert isinstance(screen, TimelineScreen) and screen.query_one(ForkProgress).running
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)  # asked, not quit
        await pilot.press("n")
        assert app.screen is screen and app.is_running
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        held.set()
        await wait_for(pilot, lambda: not app.is_running)

    try:
        run_app(db, fork_then_quit, run_id=run_id)
    finally:
        held.set()
    with Store.open(db, readonly=True) as store:
        forks = [r for r in store.runs() if r.parent == run_id]
    assert len(forks) == 1 and forks[0].status == "incomplete" and forks[0].outcome == CANCELLED

    async def listed(app, pilot):
        assert column(app, "run") == [f"#{run_id}", f"└─ #{forks[0].id}"]
        assert column(app, "outcome")[1] == "cancelled" and column(app, "status")[1] == "incomplete"

    run_app(db, listed, load_tokenizer=False)


def test_a_run_of_an_older_file_is_named_and_the_list_shows_it(tmp_path):
    """The app reads a version-1 file through a private copy migrated in memory; naming a
    run migrates the file itself, and the list reads the file from then on."""
    from test_store import build_v1

    path = tmp_path / "v1.db"
    build_v1(path)

    async def flow(app, pilot):
        assert column(app, "run") == ["#1"]
        await pilot.press("n", *"old run", "enter")
        assert column(app, "run") == ["#1 old run"]

    run_app(path, flow, load_tokenizer=False)
    with Store.open(path, readonly=True) as store:
        assert store.file_version == schema.SCHEMA_VERSION and store.run(1).name == "old run"


def test_names_from_the_file_are_shown_as_text(db):
    """A name written by hand (controls, markup, not text) is data: shown with controls
    visible, never as markup; a name that is not text is left out (the run is still fine)."""
    import sqlite3

    path, ids = db
    conn = sqlite3.connect(path)
    conn.execute("UPDATE runs SET name = ? WHERE id = ?", ("\x1b[31m[/]red", ids["parent"]))
    conn.execute("UPDATE runs SET name = X'0102' WHERE id = ?", (ids["other"],))  # a number would read as text
    conn.commit()
    conn.close()

    async def flow(app, pilot):
        names = column(app, "run")
        assert names[0] == "#1 \\x1b[31m[/]red"  # the escape made visible, the brackets literal
        assert names[-1] == "#5" and column(app, "lineage")[-1] == "recorded"  # a name not text is left out

    run_app(path, flow, load_tokenizer=False)


def test_a_big_database_shows_its_first_rows_and_reads_more_as_the_list_scrolls(tmp_path):
    """450 runs (forks, replays and programs among them, as `tttr bench app` generates them),
    and a fork of run 1 recorded last: the table holds the first window, in the fork tree's
    order (the late fork under run 1); moving the cursor or the scroll near its end reads the
    next window, until every run is listed once; marking and reloading deep in the list
    keep their run."""
    from tttr.app.bench import generate_runs
    from tttr.app.runs_listing import PAGE, fork_tree

    path = tmp_path / "many.db"
    generate_runs(path, 2 * PAGE + 49)  # of each ten runs two forks, a replay, a program (the tenth)
    with Store.open(path) as store:
        late = store.begin_run(task="t", parent=1, fork_seq=3, mutation={"site": "1:clock", "input": "+1d"})
        record_step(store, late, 1, positions=1)
        store.finish_run(late, "complete", {"passed": True})
    with Store.open(path, readonly=True) as store:
        expected = [f"{prefix}#{run.id}" for run, prefix in fork_tree(store.runs())]
        steps = {r.id: str(store.steps(r.id)) for r in store.runs()}
    assert len(expected) == 2 * PAGE + 50 and expected[1] == f"└─ #{late}"

    async def flow(app, pilot):
        table = app.screen.query_one("#runs")
        title = lambda: str(app.screen.query_one("#runs-title").render())  # noqa: E731
        assert table.row_count == PAGE and column(app, "run") == expected[:PAGE]
        assert f"{len(expected)} runs ({PAGE} listed, more as you scroll)" in title()
        assert column(app, "steps") == [steps[int(r.split("#")[1])] for r in expected[:PAGE]]
        assert column(app, "task")[expected.index("#10")] == "python3 agent_2.py"  # a recorded program
        await pilot.press("ctrl+end")  # the cursor to the last row read: the next window comes
        await wait_for(pilot, lambda: table.row_count == 2 * PAGE)
        assert column(app, "run") == expected[: 2 * PAGE]
        table.scroll_to(y=table.max_scroll_y, animate=False)  # the scroll alone, the cursor left behind
        await wait_for(pilot, lambda: table.row_count == len(expected))
        assert column(app, "run") == expected and "more as you scroll" not in title()
        assert len(set(column(app, "run"))) == len(expected)
        deep = int(expected[2 * PAGE + 10].split("#")[1])
        await cursor_to(app, pilot, deep)
        await pilot.press("space")
        assert app.screen.marked == [deep] and column(app, "")[2 * PAGE + 10] == "●"
        await pilot.press("r")  # listed afresh: down to the cursor's run, which keeps the cursor
        assert app.screen._current() == deep and table.row_count >= 2 * PAGE + 11
        assert column(app, "")[2 * PAGE + 10] == "●" and f"marked for diff: #{deep}" in title()

    run_app(path, flow, load_tokenizer=False)


def _copy_as_replay(store, source: int, parent: int) -> int:
    """A replay of `parent` whose events are `source`'s (as a replay stores them, step by step)."""
    replay = store.begin_run(task="rotate-logs", parent=parent, fork_seq=0, meta={"replay": {"free": ["token"]}},
                             seed=1)
    step = None
    for e in store.events(source):
        if step is not None and e.step != step:
            store.commit_step(replay)
        store.append(replay, e.site, e.value)
        step = e.step
    store.commit_step(replay)
    store.finish_run(replay, "complete", store.run(source).outcome)
    return replay


def test_a_replays_row_says_whether_it_was_identical_and_where_it_diverged(tmp_path):
    from tests.app_helpers import two_runs

    path = two_runs(tmp_path / "replays.db", 4, 3)  # run 2 takes another command at step 2
    with Store.open(path) as store:
        same, diverged = _copy_as_replay(store, 1, 1), _copy_as_replay(store, 2, 1)
        from tttr.engine.replay.diff import diff_runs

        first = diff_runs(store, 1, diverged).first_cause.site  # the full diff's first cause

    async def flow(app, pilot):
        screen = app.screen
        await wait_for(pilot, lambda: {same, diverged} <= set(screen.verdicts))
        await pilot.pause()
        lineage = dict(zip(column(app, "run"), column(app, "lineage")))
        assert lineage[f"├─ #{same}"] == "replay of #1 (free token): identical"
        assert lineage[f"└─ #{diverged}"] == f"replay of #1 (free token): diverged at {first}"

    run_app(path, flow, load_tokenizer=False)


def test_the_runs_list_takes_the_timelines_keys(db):
    path, ids = db

    async def flow(app, pilot):
        table = app.screen.query_one("#runs")
        await pilot.press("j", "j")
        assert table.cursor_row == 2
        await pilot.press("k")
        assert table.cursor_row == 1
        await pilot.press("G")
        assert table.cursor_row == table.row_count - 1
        await pilot.press("g")
        assert table.cursor_row == 0
        await pilot.press("end", "enter")  # the last run opens, not the first
        assert isinstance(app.screen, TimelineScreen) and app.screen.view.run_id == ids["other"]
        await pilot.press("escape", "home", "enter")
        assert app.screen.view.run_id == ids["parent"]

    run_app(path, flow, load_tokenizer=False)


def test_record_prints_the_checkers_reason_when_a_run_fails(capsys):
    """What `tttr record` prints of a run it recorded (the printing alone: a recording takes the model)."""
    from argparse import Namespace

    from tttr.app.commands.agent import _print_result
    from tttr.engine.replay.result import RunResult

    failed = RunResult(7, "complete", {"passed": False, "checker_exit": 1,
                                       "checker_output": "no file greeting.txt\nsecond line"}, ["echo hi > greet.txt"])
    _print_result(Namespace(json=False), failed, "recorded")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "recorded run 7: 1 steps, outcome failed, status complete"
    assert out[1] == "  checker: no file greeting.txt"
    passed = RunResult(8, "complete", {"passed": True, "checker_exit": 0, "checker_output": "ok"}, ["ls"])
    _print_result(Namespace(json=False), passed, "recorded")
    assert "checker" not in capsys.readouterr().out
