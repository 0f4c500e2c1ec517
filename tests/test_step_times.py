"""Per-step timings (issue 29): what each step took (the model's time, the tool's time, the
wait), stored beside the events in `step_times`, never as events. The store's API, a fork's
prefix, an older file, hostile rows and merge; then real recordings (the built-in agent, a
served call, a recorded program) have a row for each step, and a replay stays identical."""

from __future__ import annotations

import sqlite3
import textwrap

import pytest

from tttr.sessions import schema
from tttr.sessions.merge import merge
from tttr.sessions.store import Store
from tttr.sessions.timings import StepTime


def _run(store: Store, steps: int, parent: int | None = None, fork_site: str | None = None) -> int:
    run = store.begin_run(task="t", seed=1, parent=parent, fork_site=fork_site)
    first = 0 if parent is None else int(fork_site.split(":")[0])
    if parent is None:
        store.append(run, "setup:clock", {"t": "2026-01-01T00:00:00"})
        store.commit_step(run)
    for step in range(first, steps):
        store.append(run, f"{step}:message", {"text": f"m{step}"})
        store.append(run, f"{step}:clock", {"t": "2026-01-01T00:00:01"})
        store.commit_step(run)
        store.time_step(run, step, model_ms=10.0 + step + (100 if parent else 0), tool_ms=None, wait_ms=0.5)
    store.finish_run(run)
    return run


def test_a_steps_timing_is_stored_beside_its_events_and_a_fork_reads_its_parents_prefix(tmp_path):
    with Store.open(tmp_path / "s.db") as store:
        run = _run(store, 3)
        events = [(e.site, e.value) for e in store.events(run)]
        fork = _run(store, 4, parent=run, fork_site="1:clock")  # step 1 holds the fork point: the fork's own
        assert store.step_times(run) == [StepTime(s, 10.0 + s, None, 0.5) for s in range(3)]
        assert [t.model_ms for t in store.step_times(fork)] == [10.0, 111.0, 112.0, 113.0]
        assert [(e.site, e.value) for e in store.events(run)] == events  # no event was added
        assert store.count_events(run) == len(events)
        store.time_step(run, 0, model_ms=1.0, tool_ms=2.0, wait_ms=3.0)  # again: replaced
        assert store.step_times(run)[0] == StepTime(0, 1.0, 2.0, 3.0)
        store.delete_run(fork)
        assert store._conn.execute("SELECT count(*) FROM step_times WHERE run = ?", (fork,)).fetchone() == (0,)


def test_hostile_timing_rows_read_as_absent(tmp_path):
    path = tmp_path / "s.db"
    with Store.open(path) as store:
        run = _run(store, 4)
    conn = sqlite3.connect(path)
    conn.executemany("UPDATE step_times SET model_ms = ?, tool_ms = ?, wait_ms = ? WHERE step = ?", [
        ("twelve", b"\x00", -1.0, 0), (float("inf"), 1e300, "nan", 1), (None, None, None, 2), (5, 2.5, 0, 3)])
    conn.execute("INSERT INTO step_times VALUES (?, 'x', 1, 1, 1)", (run,))  # a step that is not one
    conn.commit()
    conn.close()
    with Store.open(path, readonly=True) as store:
        assert store.step_times(run) == [StepTime(3, 5.0, 2.5, 0.0)]  # 0-2 hold no number; 'x' is no step
        with pytest.raises(Exception, match="no run 99"):
            store.step_times(99)


def test_step_counts_and_the_timing_view_read_a_fork_and_a_hostile_file(tmp_path):
    from tttr.app.steps import step_timings

    path = tmp_path / "s.db"
    with Store.open(path) as store:
        run = _run(store, 3)
        fork = _run(store, 4, parent=run, fork_site="1:clock")
        assert store.step_counts(run) == {-1: 1, 0: 2, 1: 2, 2: 2}
        # step 1: the parent's message (before the fork seq), then the fork's own message and clock
        assert store.step_counts(fork) == {-1: 1, 0: 2, 1: 3, 2: 2, 3: 2}
        assert store.step_counts(run, "message") == {0: 1, 1: 1, 2: 1} and store.step_counts(run, "token") == {}
        store.append(run := store.begin_run(task="hostile"), "0:tool", {"cmd": "ls", "duration_ms": 3})
        store.append(run, "1:tool", {"cmd": "ls", "duration_ms": 3})
        store.commit_step(run)
        store.finish_run(run)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE events SET step = 'x' WHERE id = ?", ((run << 32) | 1,))
    conn.execute("UPDATE events SET value = '{\"cmd\": [1], \"duration_ms\": \"NaN\"}' WHERE id = ?", (run << 32,))
    conn.commit()
    conn.close()
    with Store.open(path, readonly=True) as store:
        assert store.step_counts(run) == {-1: 1, 0: 1}  # a step that is not a number counts as the setup's
        timings = step_timings(store, run)
    # the row whose step is damaged is not trusted; the other's command and duration are of the wrong types
    assert [(t.step, t.tool_ms, t.command) for t in timings] == [(-1, None, ""), (0, None, "")]


def test_an_older_file_read_only_reads_as_not_recorded_and_is_not_written(tmp_path, capsys):
    from tttr.app.cli import main
    from tttr.app.steps import TIMING_LACKS, step_timings, timings_recorded

    path = tmp_path / "v3.db"
    conn = sqlite3.connect(path, isolation_level=None)
    schema.migrate(conn, upto=3)
    conn.close()
    with Store.open(path) as store:  # writes its runs at version 4, then made a version-3 file again
        run = _run(store, 2)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TABLE step_times")
    conn.execute("PRAGMA user_version = 3")
    conn.close()
    before = path.read_bytes()
    with Store.open(path, readonly=True) as store:
        assert store.file_version == 3 and store.step_times(run) == []
        timings = step_timings(store, run)  # what the timing view and `tttr events --timing` read
        assert [t.step for t in timings] == [-1, 0, 1] and not timings_recorded(timings)
    assert main(["events", str(path), str(run), "--timing"]) == 0
    assert TIMING_LACKS in capsys.readouterr().out  # the fallback, saying why
    assert path.read_bytes() == before
    with Store.open(path) as store:  # opened for writing: migrated, as the other migrations are
        assert store.step_times(run) == []
        store.time_step(run, 1, model_ms=4.0)
        assert store.step_times(run) == [StepTime(1, 4.0, None, None)]
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION


def test_merge_carries_the_timings_with_their_runs(tmp_path):
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    with Store.open(a) as store:
        _run(store, 2)
    with Store.open(b) as store:
        first = _run(store, 1)
        _run(store, 3, parent=first, fork_site="0:clock")
    res = merge([a, b], tmp_path / "m.db")
    with Store.open(tmp_path / "m.db", readonly=True) as store:
        assert [t.model_ms for t in store.step_times(res.run_ids[(0, 1)])] == [10.0, 11.0]
        assert [t.model_ms for t in store.step_times(res.run_ids[(1, 2)])] == [110.0, 111.0, 112.0]


def test_tttr_events_timing_prints_each_steps_times_and_json(tmp_path, capsys):
    import json

    from tttr.app.cli import main
    from tttr.app.steps import TIMING_LACKS

    path = tmp_path / "s.db"
    with Store.open(path) as store:
        run = _run(store, 2)
        store.time_step(run, 1, model_ms=1234.5, tool_ms=6.25, wait_ms=0.75)
        bare = store.begin_run(task="no timings")
        store.append(bare, "0:message", {"text": "\x1b[31m"})
        store.finish_run(bare)
    assert main(["events", str(path), str(run), "--timing"]) == 0
    out = capsys.readouterr().out
    assert "model ms" in out and "1,234.5" in out and "6.2" in out and TIMING_LACKS not in out
    assert main(["events", str(path), str(run), "--timing", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["recorded"] is True and [s["step"] for s in answer["steps"]] == ["setup", 0, 1]
    assert answer["steps"][2] | {"command": ""} == {"step": 1, "tokens": 0, "model_ms": 1234.5, "tool_ms": 6.25,
                                                   "wait_ms": 0.75, "command": ""}
    assert answer["totals"] == {"model_ms": 1244.5, "tool_ms": 6.25, "wait_ms": 1.25}
    assert main(["events", str(path), str(bare), "--timing"]) == 0
    assert TIMING_LACKS in capsys.readouterr().out
    before = path.read_bytes()
    assert main(["events", str(path), str(run), "--timing", "--kind", "token"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--timing" in err[0] and path.read_bytes() == before


def test_an_exported_trace_carries_each_steps_timing(tmp_path):
    from tttr.engine.traces.transfer import run_traces

    path = tmp_path / "s.db"
    with Store.open(path) as store:
        run = _run(store, 2)
        store.time_step(run, 1, model_ms=7.5, tool_ms=None, wait_ms=None)
    (trace,) = run_traces(str(path), [run])
    chats = sorted((s for s in trace.spans if s.name.startswith("chat")), key=lambda s: s.attributes["tttr.step"])
    assert [(c.attributes.get("tttr.step.model_ms"), c.attributes.get("tttr.step.wait_ms")) for c in chats] == [
        (10.0, 0.5), (7.5, None)]


def test_the_timing_view_of_a_long_run_scrolls_by_the_screens_keys(tmp_path):
    from tests.app_helpers import run_app, two_runs, wait_for
    from tttr.app.bench import time_steps
    from tttr.app.screens.timing import TimingScreen

    path = two_runs(tmp_path / "long.db", 40, 3)
    time_steps(path, 1)

    async def flow(app, pilot):
        await pilot.press("t")
        screen = app.screen
        assert isinstance(screen, TimingScreen)
        await wait_for(pilot, lambda: screen.timings is not None)
        await pilot.pause()
        dialog = screen.query_one("#timing-dialog")
        assert dialog.max_scroll_y > 0 and dialog.scroll_y == 0
        seen = []
        for key in ("pagedown", "down", "end", "up", "home"):  # unanimated: each lands at once
            await pilot.press(key)
            seen.append(dialog.scroll_y)
        top = dialog.max_scroll_y
        assert seen[0] > 0 and seen[1] == seen[0] + 1 and seen[2] == top and seen[3] == top - 1 and seen[4] == 0
        await pilot.press("escape")
        assert not isinstance(app.screen, TimingScreen)

    run_app(path, flow, run_id=1, load_tokenizer=False, size=(100, 24))


# ---------------------------------------------------------------------------- real recordings
@pytest.fixture(scope="module")
def agent_db(tmp_path_factory):
    """One write-line run of the default model in the sandbox, and its faithful replay."""
    from tttr.engine.replay.runs import record, replay
    from tttr.engine.replay.runtime import Runtime

    path = tmp_path_factory.mktemp("timed") / "session.db"
    runtime = Runtime(kernel_mode="invariant")
    try:
        with Store.open(path) as store:
            res = record(store, "write-line", runtime=runtime, seed=1, temperature=0.7)
            again = replay(store, res.run_id, (), runtime=runtime)
    finally:
        runtime.close()
    return path, res, again


@pytest.mark.slow
def test_a_recorded_agent_run_has_each_steps_model_tool_and_wait_and_its_replay_is_identical(agent_db):
    from tttr.engine.replay.diff import diff_runs

    path, res, again = agent_db
    assert again.identical and again.divergence is None
    with Store.open(path, readonly=True) as store:
        steps = store.steps(res.run_id)
        times = store.step_times(res.run_id)
        assert [t.step for t in times] == [-1, *range(steps)]
        assert times[0].model_ms is None and times[0].tool_ms > 0  # the setup builds the start tree
        for t in times[1:]:
            assert t.model_ms > 0 and t.wait_ms >= 0
        commands = {e.step for e in store.events(res.run_id, kind="tool")}
        assert {t.step for t in times if t.tool_ms is not None} == {-1} | commands
        replayed = store.step_times(again.run_id)
        assert [t.step for t in replayed] == [t.step for t in times]
        assert diff_runs(store, res.run_id, again.run_id).identical


@pytest.mark.slow
def test_the_timing_view_draws_a_real_runs_model_tool_and_wait(agent_db):
    from tests.app_helpers import run_app, wait_for
    from tttr.app.screens.timing import TimingScreen
    from tttr.app.steps import TIMING_LACKS

    path, res, _ = agent_db
    with Store.open(path, readonly=True) as store:
        first = store.step_times(res.run_id)[1]

    async def flow(app, pilot):
        await pilot.press("t")
        screen = app.screen
        assert isinstance(screen, TimingScreen)
        await wait_for(pilot, lambda: screen.timings is not None)
        shown = str(screen.query_one("#timing").render())
        assert "model ms" in shown and "tool ms" in shown and "wait ms" in shown
        assert f"{first.model_ms:,.1f}" in shown
        assert str(screen.query_one("#timing-note").render()) != TIMING_LACKS

    run_app(path, flow, run_id=res.run_id, load_tokenizer=False)


SDK_AND_CALL = textwrap.dedent("""\
    from tttr.recorders import sdk
    from openai import OpenAI

    @sdk.tool
    def add(a, b):
        return a + b

    client = OpenAI()
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi"}],
                                       max_tokens=3, temperature=0)
    print(add(2, 3))
""")


@pytest.mark.slow
def test_a_recorded_program_times_its_model_call_its_tool_and_its_own_time(tmp_path, capsys):
    from sandbox_helpers import needs_sandbox  # noqa: F401 - the program runs in the sandbox
    from tests.program_helpers import program_tree, record_program

    db = tmp_path / "s.db"
    res = record_program(capsys, db, program_tree(tmp_path, "a", SDK_AND_CALL))
    assert res["exit_code"] == 0 and res["calls"] == 1, res["stderr"]
    with Store.open(db, readonly=True) as store:
        events = store.events(res["run_id"])
        call = next(e.step for e in events if e.kind == "prompt")
        tool = next(e.step for e in events if e.kind == "tool" and e.value.get("source") == "sdk")
        last = events[-1].step
        times = {t.step: t for t in store.step_times(res["run_id"])}
    assert set(times) == {call, tool, last}
    assert times[call].model_ms > 0 and times[call].tool_ms is None and times[call].wait_ms >= 0
    assert times[tool].model_ms is None and times[tool].tool_ms >= 0 and times[tool].wait_ms >= 0
    assert times[last].wait_ms >= 0 and times[last].model_ms is None


@pytest.mark.slow
def test_served_and_proxied_calls_of_one_run_have_the_models_time_and_the_clients_wait(tmp_path):
    import time

    from openai import OpenAI

    from tests.serve_helpers import recording_server

    from tttr.engine.serve.modes import Proxied
    from tttr.engine.serve.proxy import Upstream
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.engine.serve.server import create_app
    from tests.serve_helpers import Running

    db, proxied_db = tmp_path / "served.db", tmp_path / "proxied.db"
    running = recording_server(db)
    proxy_recorder = CallRecorder(proxied_db, None)
    proxy = Running(create_app(Proxied(Upstream(running.url + "/v1")), proxy_recorder))
    try:
        for url in (running.url, proxy.url):  # the engine's calls, then the same through `--upstream`
            client = OpenAI(base_url=url + "/v1", api_key="x", default_headers={"X-TTTR-Run": "two-calls"})
            for _ in range(2):
                client.chat.completions.create(model=running.service.model_id, max_tokens=3, temperature=0,
                                               messages=[{"role": "user", "content": "Say hi"}])
                time.sleep(0.2)  # the client's own time, between its calls
    finally:
        proxy.stop()
        running.stop()
        proxy_recorder.close()
        running.recorder.close()
        running.service.close()
    for path in (db, proxied_db):
        with Store.open(path, readonly=True) as store:
            (run,) = [r for r in store.runs() if r.task == "two-calls"]
            times = store.step_times(run.id)
        assert [t.step for t in times] == [0, 1], path
        assert all(t.model_ms > 0 and t.tool_ms is None for t in times)
        assert times[0].wait_ms is None and times[1].wait_ms >= 150  # the first call has no call before it
