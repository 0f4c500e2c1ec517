"""A run's kind describes its steps (`RunKind.steps`), and `tttr diff` and the compare screen
both list them that way: the built-in agent's actions, or a run of model calls' messages, SDK
tools, clock reads and end. Real SQLite files written through the store; no model."""

from __future__ import annotations

import pytest

from tttr.app.compare import build_comparison
from tttr.engine.kinds import AGENT, CALLS, IMPORTED, PROGRAM, KindError, kind_of
from tttr.engine.replay.diff import diff_runs
from tttr.sessions.store import Store

T = "2026-03-02T09:05:00"


def _program(store, message: str) -> int:
    run = store.begin_run(task="program:python3", model_id="m", kernel_mode="invariant", seed=1,
                          meta={"source": "tttr record", "program": ["python3", "a.py"]})
    store.append(run, "0:clock", {"t": T, "source": "program"})  # the program's own read, taken with its call
    store.append(run, "0:message", {"text": message})
    store.append(run, "1:tool", {"function": "add", "args": [1, 2], "kwargs": {}, "result": 3})
    store.append(run, "2:clock", {"t": T})
    store.append(run, "3:tool", {"program": ["python3", "a.py"], "exit_code": 0, "stdout": "ok\n", "stderr": ""})
    store.finish_run(run, "complete", {"passed": True})
    return run


def _agent(store, clock: str = T) -> int:
    run = store.begin_run(task="write-line", model_id="m", kernel_mode="invariant", seed=1, meta={})
    store.append(run, "0:clock", {"t": clock})
    store.append(run, "0:action", {"cmd": "echo hi > a"})
    store.append(run, "0:tool", {"cmd": "echo hi > a", "stdout": "", "stderr": "", "exit_code": 0})
    store.commit_step(run)
    store.append(run, "1:action", {"done": True})
    store.finish_run(run, "complete", {"passed": True})
    return run


@pytest.fixture
def db(tmp_path):
    path = tmp_path / "steps.db"
    with Store.open(path, create=True) as store:
        ids = {"p1": _program(store, "hi"), "p2": _program(store, "hello"), "agent": _agent(store),
               "agent2": _agent(store, "2026-03-09T09:05:00")}
    return path, ids


def test_each_kind_lists_its_steps_and_a_calls_own_clock_read_is_no_row(db):
    path, ids = db
    with Store.open(path, readonly=True) as store:
        run, events = store.load_run(ids["p1"])
        assert kind_of(run) is PROGRAM
        keys = [s.key for s in PROGRAM.steps(events)]
        assert keys == ["hi", "add(1, 2) → 3", f"clock {T}", 'end: python3 a.py (exit 0) · stdout "ok"']
        assert [s.step for s in PROGRAM.steps(events)] == [0, 1, 2, 3]
        assert CALLS.steps(events) == IMPORTED.steps(events) == PROGRAM.steps(events)  # one description of calls
        assert AGENT.steps(events) == []  # no actions
        run, events = store.load_run(ids["agent"])
        assert [s.key for s in AGENT.steps(events)] == ["echo hi > a", "done"]
        assert AGENT.step_kinds == ("action",) and PROGRAM.step_kinds == CALLS.step_kinds


def test_the_compare_screen_lists_the_steps_tttr_diff_aligns(db):
    """Each compare row shows the step the diff's row names: the differing message is the row
    marked different, not a clock read beside it."""
    path, ids = db
    with Store.open(path, readonly=True) as store:
        d = diff_runs(store, ids["p1"], ids["p2"])
        c = build_comparison(store, ids["p1"], ids["p2"])
    assert [(r.a_step, r.b_step, r.same) for r in d.rows] == [(0, 0, False), (1, 1, True), (2, 2, True), (3, 3, True)]
    assert len(c.rows) == len(d.rows)
    assert [(r.a.action, r.b.action, r.same) for r in c.rows] == [
        ("hi", "hello", False), ("add(1, 2)  → 3", "add(1, 2)  → 3", True), (f"clock {T}", f"clock {T}", True),
        ("python3 a.py", "python3 a.py", True)]
    assert d.note is None


def test_two_kinds_side_by_side_list_both_runs_steps_and_say_why_none_pair(db, capsys):
    from tttr.app.cli import main

    path, ids = db
    with Store.open(path, readonly=True) as store:
        d = diff_runs(store, ids["agent"], ids["p1"])
    assert [r.a_action for r in d.rows if r.a_action is not None] == ["echo hi > a", "done"]
    assert [r.b_action for r in d.rows if r.b_action is not None][0] == "hi" and not any(r.same for r in d.rows)
    assert d.note == (f"run {ids['agent']} is the built-in agent's run and run {ids['p1']} a recorded program's run: "
                      "their steps are of different kinds, so no row can pair up")
    assert "note" not in d.to_json()
    assert main(["diff", str(ids["agent"]), str(ids["p1"]), "--db", str(path)]) == 0
    assert capsys.readouterr().err == f"note: {d.note}\n"


def test_deltas_are_the_kinds_and_a_kind_without_them_refuses_in_one_line(db):
    from tttr.engine.replay.deltas import DeltaError

    path, ids = db
    before = path.read_bytes()
    with Store.open(path, readonly=True) as store:
        with pytest.raises(KindError, match=f"^run {ids['p2']} is a served API's calls: ") as refused:
            CALLS.deltas(store, ids["p1"], ids["p2"])
        assert "\n" not in str(refused.value)
        with pytest.raises(DeltaError, match="is not a recorded program"):
            PROGRAM.deltas(store, ids["p1"], ids["agent"])
        with pytest.raises(DeltaError, match="has no setup:setup with the start tree"):  # checked as a program
            PROGRAM.deltas(store, ids["p1"], ids["p2"])
        found = AGENT.deltas(store, ids["agent"], ids["agent2"])
        assert [(d.site, d.layer, d.base, d.value) for d in found] == [("0:clock", "trace", T, "2026-03-09T09:05:00")]
        with pytest.raises(DeltaError, match="are the same run"):
            AGENT.deltas(store, ids["agent"], ids["agent"])
    assert path.read_bytes() == before
