"""The app on a recorded program (`tttr record -- PROGRAM`): a real program, recorded once
with the default model in the real sandbox, read on the timeline (model call, SDK tool,
clock reads, the program's output and exit code) and forked from the edit dialog: at an SDK
tool's result (the program takes another path and calls the model again, live) and at the
setup clock (the whole run at another time). Nothing is faked."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from sandbox_helpers import needs_sandbox
from test_program_fork import PROGRAM as FORK_PROGRAM
from tests.app_helpers import open_store, run_app, wait_for
from tttr.app.screens.ask import AskScreen
from tttr.app.screens.compare import CompareScreen
from tttr.app.screens.edit import EditScreen
from tttr.app.screens.timeline import TimelineScreen
from tttr.app.widgets.detail import DetailPane
from tttr.app.widgets.fork_progress import ForkProgress
from tttr.app.widgets.side_by_side import SideBySide
from tttr.app.widgets.timeline import Timeline
from tttr.sessions.vocabulary import SETUP_STEP, site

pytestmark = [pytest.mark.slow, needs_sandbox]

ROOT = Path(__file__).resolve().parent.parent
# test_program_fork's program (a model call, an @sdk.tool that decides whether to call again),
# then a clock read and a line on stderr.
PROGRAM = FORK_PROGRAM + textwrap.dedent("""\
    print("at:", sdk.now().isoformat())
    print("done deciding", file=__import__("sys").stderr)
""")


@pytest.fixture(scope="module")
def program_db(tmp_path_factory):
    """One program run, recorded as a user records it."""
    base = tmp_path_factory.mktemp("program")
    tree = base / "tree"
    tree.mkdir()
    (tree / "prog.py").write_text(PROGRAM)
    db = base / "s.db"
    out = subprocess.run(
        [sys.executable, "-m", "tttr.app", "record", "--db", str(db), "--tree", str(tree), "--seed", "7",
         "--clock", "2026-03-02T10:00:00", "--", "python3", "prog.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stderr
    assert "verdict: stop" in out.stdout
    return db, int(out.stdout.split("recorded run ")[1].split()[0])


async def _at(app, pilot, at: str) -> None:
    timeline = app.screen.query_one(Timeline)
    timeline.cursor = timeline.view.at(at).seq
    await pilot.pause()


async def _fork_from_dialog(app, pilot, value: str) -> tuple[int, object]:
    """Type `value` in the open edit dialog, fork, and wait for the side-by-side."""
    app.screen.query_one("#edit-value").value = value
    await pilot.press("ctrl+s")
    assert isinstance(app.screen, TimelineScreen)
    assert app.screen.query_one(ForkProgress).started == 1  # the program re-runs in a worker, with a bar
    await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and bool(app.screen.query(SideBySide)),
                   timeout=600)
    side = app.screen.query_one(SideBySide)
    await wait_for(pilot, lambda: side.comparison is not None, timeout=60)
    return side.comparison.run_b, side.comparison


def _lines(timeline: Timeline) -> list[str]:
    return [timeline.render_line(y).text.rstrip() for y in range(timeline.size.height)]


def test_a_program_run_reads_on_one_timeline(program_db):
    db, run_id = program_db

    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        steps = "\n".join(_lines(timeline))  # the step tree: one row per step, what it did
        assert 'decide("' in steps and "$ python3 prog.py → exit 0" in steps
        await pilot.press("z")  # every step expanded: one row per event
        lines = "\n".join(_lines(timeline))
        assert "python3 prog.py · clock 2026-03-02T10:00:00" in lines  # the setup: command line and clock
        assert lines.count("sdk.now()") == 1  # the clock read, marked as the program's
        assert 'decide("' in lines and '→ "stop"' in lines  # the SDK tool: its call and its result
        assert "$ python3 prog.py  → exit 0" in lines  # the program's end
        assert any(":outcome" in ln and "exit 0" in ln for ln in lines.splitlines())  # no checker: its exit code
        assert "exit 0" in str(app.screen.query_one("#run-title").render())  # the run's outcome, not its JSON
        pane = app.screen.query_one(DetailPane)

        await _at(app, pilot, "1:tool")
        assert "function" in pane.text and "decide" in pane.text and '"stop"' in pane.text
        assert "press e to edit" in pane.text
        await _at(app, pilot, "3:tool")
        await wait_for(pilot, lambda: "verdict: stop" in pane.text)  # stdout, loaded in a worker
        assert "done deciding" in pane.text  # stderr
        assert "not recorded" not in pane.text and "press e to edit" not in pane.text
        await pilot.press("e")  # the program's own output is no fork site
        assert isinstance(app.screen, TimelineScreen)
        await _at(app, pilot, "0:token:0")
        assert "top-5 alternatives" in pane.text  # the model call's tokens and logits, as for the agent
        await pilot.press("e")
        dialog = app.screen
        assert isinstance(dialog, EditScreen) and len(dialog.alternatives) == 5
        dialog.query_one("#edit-value").value = "id:99999999"  # checked as `tttr fork` checks it
        await pilot.press("ctrl+s")
        assert app.screen is dialog and "99999999" in str(dialog.query_one("#edit-error").render())
        await pilot.press("escape")
        assert isinstance(app.screen, TimelineScreen)

    run_app(db, flow, run_id=run_id)


def test_edit_an_sdk_result_in_the_app_forks_the_program(program_db):
    db, run_id = program_db

    async def flow(app, pilot):
        await _at(app, pilot, "1:tool")
        await pilot.press("e")
        dialog = app.screen
        assert isinstance(dialog, EditScreen) and dialog.current == '"stop"' and dialog.kind == "function"
        dialog.query_one("#edit-value").value = "exit=3"  # a command's grammar: refused, the dialog stays
        await pilot.press("ctrl+s")
        assert app.screen is dialog and "no exit code" in str(dialog.query_one("#edit-error").render())
        before = {r.id for r in app.store.runs()}
        child, comparison = await _fork_from_dialog(app, pilot, "again")
        assert comparison.run_a == run_id and comparison.fork_site == "1:tool"
        fork_row = next(r for r in comparison.rows if r.fork)  # every program step has a row: the tool's too
        assert '→ "stop"' in fork_row.a.action and '→ "again"' in fork_row.b.action and not fork_row.same
        assert {r.id for r in app.store.runs()} - before == {child}
        return child

    child = run_app(db, flow, run_id=run_id)
    store = open_store(db)
    try:
        run, events = store.load_run(child)
        assert run.parent == run_id and run.status == "complete" and run.mutation["value"] == {"result": "again"}
        end = next(e.value for e in events if e.kind == "tool" and "program" in e.value)
        stdout = store.get_blob(end["stdout"]["$blob"]).decode() if isinstance(end["stdout"], dict) else end["stdout"]
        assert "verdict: again" in stdout and "second:" in stdout  # the other path, its call generated live
        assert run.outcome["calls_generated"] == 1 and run.outcome["logits_computed"] > 0
    finally:
        store.close()


def test_the_setup_clock_forks_the_whole_program_from_the_app(program_db):
    db, run_id = program_db

    async def flow(app, pilot):
        await _at(app, pilot, site(SETUP_STEP, "setup"))
        await pilot.press("e")  # which setup value: a start-tree file, a variable or the clock
        assert isinstance(app.screen, AskScreen)
        app.screen.query_one("#ask-value").value = "clock"
        await pilot.press("enter")
        dialog = app.screen
        assert isinstance(dialog, EditScreen) and dialog.site == site(SETUP_STEP, "clock")
        assert dialog.current == "2026-03-02T10:00:00"
        child, comparison = await _fork_from_dialog(app, pilot, "+1d")
        setup = comparison.rows[0]
        assert setup.a.step == setup.b.step == -1 and not setup.same  # the setups differ: their clocks
        return child

    child = run_app(db, flow, run_id=run_id)
    store = open_store(db)
    try:
        _, parent_events = store.load_run(run_id)
        run, events = store.load_run(child)
        assert run.parent == run_id and run.status == "complete"
        assert run.outcome["logits_computed"] == 0  # the prompts do not hold the time: answered as recorded

        def clocks(evs):
            return [datetime.fromisoformat(e.value["t"]) for e in evs if e.kind == "clock" and e.step >= 0]

        assert [t - timedelta(days=1) for t in clocks(events)] == clocks(parent_events) != []
    finally:
        store.close()


def test_a_program_fork_can_be_cancelled(program_db):
    db, run_id = program_db

    async def flow(app, pilot):
        await _at(app, pilot, "1:tool")
        before = {r.id for r in app.store.runs()}
        await pilot.press("e")
        assert isinstance(app.screen, EditScreen)
        app.screen.query_one("#edit-value").value = "again"  # the other path needs a call generated live
        await pilot.press("ctrl+s")
        screen = app.screen
        assert screen.fork_cancel is not None
        await pilot.press("x")  # the program's next model call is refused: it ends early
        await wait_for(pilot, lambda: screen.fork_cancel is None, timeout=600)
        assert app.screen is screen  # no side-by-side for a cancelled fork
        assert not screen.query_one(ForkProgress).display
        new = [r for r in app.store.runs() if r.id not in before]
        assert len(new) == 1 and new[0].status == "incomplete" and new[0].parent == run_id
        assert new[0].outcome["reason"].startswith("cancelled while the program ran")

    run_app(db, flow, run_id=run_id)


# -- an example agent as a user records it (assets/examples/README.md) ----------------------
@pytest.fixture(scope="module")
def example_db(tmp_path_factory):
    """assets/examples/openai_agent.py recorded on its task with the task's check, then forked
    at its `list_files` result with the file already there (it stops, the check fails)."""
    base = tmp_path_factory.mktemp("example")
    task = ROOT / "assets" / "tasks" / "write-line"
    tree = base / "work"
    tree.mkdir()
    subprocess.run(["sh", str(task / "setup.sh")], cwd=tree, check=True)
    shutil.copy(ROOT / "assets" / "examples" / "openai_agent.py", tree)
    shutil.copy(task / "check.sh", tree)
    db = base / "agent.db"
    for argv in (["record", "--db", str(db), "--tree", str(tree), "--seed", "1", "--clock", "2026-03-02T09:05:00",
                  "--check", "sh check.sh", "--", "python3", "openai_agent.py"],
                 ["fork", "1", "--db", str(db), "--at", "1:tool", "--set", '["README", "greeting.txt"]']):
        out = subprocess.run([sys.executable, "-m", "tttr.app", *argv], cwd=ROOT, capture_output=True, text=True,
                             timeout=900)
        assert out.returncode == 0, out.stdout + out.stderr
    return db  # run 1 the recording, run 2 the fork


def test_an_example_agents_call_parameters_finish_reason_and_sdk_shell_output_size_are_shown(example_db):
    store = open_store(example_db)
    try:
        _, events = store.load_run(1)
    finally:
        store.close()
    recorded = {e.site: e.value for e in events}

    async def flow(app, pilot):
        pane = app.screen.query_one(DetailPane)

        def read() -> str:
            return " ".join(pane.text.split())  # as read, whatever the pane's width wrapped

        await _at(app, pilot, "2:prompt")
        await wait_for(pilot, lambda: "verified" in pane.text)  # the text rebuilt from the record
        assert f"model asked {recorded['2:prompt']['request']['model']}" in read()  # the name the program sent
        assert "max tokens 12" in read() and "temperature 0.0" in read()  # its max_tokens=12, temperature=0
        await _at(app, pilot, "3:message")
        ended = recorded["3:message"]["finish_reason"]
        assert f"finish reason {ended}" in read()
        if ended == "length":
            assert "cut at the call's max_tokens" in read()
        await _at(app, pilot, "5:tool")  # sdk.shell("cat greeting.txt")
        assert "output stdout 12 B, stderr 0 B" in read()  # the output is stored inline, its size is not
        await _at(app, pilot, "6:outcome")  # the last step's row stands on its outcome; expanded, its own line
        await pilot.press("space")
        await _at(app, pilot, "6:outcome")
        line = _lines(app.screen.query_one(Timeline))
        assert any("6:outcome" in ln and "passed (checker exit 0)  exit 0" in ln for ln in line), line
        await pilot.press("e")  # no fork site: it says why, in words
        assert str(list(app._notifications)[-1].message).startswith("an outcome event cannot be edited")

    run_app(example_db, flow, run_id=1)


def test_a_checked_forks_outcome_shows_the_check_and_how_the_program_ran(example_db):
    async def flow(app, pilot):
        pane = app.screen.query_one(DetailPane)
        await pilot.press("G")  # the fork's last event: its outcome
        text = " ".join(pane.text.split())  # as read, whatever the pane's width wrapped
        assert "failed (checker exit 1) no file greeting.txt" in text  # the check's verdict
        assert "exit code exit 1 differs from the recording" in text  # how the program ran, beside the recording
        assert "fork site 1:tool" in text and "calls generated 0" in text
        assert "diverged at step 3 recorded a model call live (the program ended)" in text

    run_app(example_db, flow, run_id=2)
