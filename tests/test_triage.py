"""Locate the layer and bisect, end to end on the embedded default model, the real sandbox and
a real session database: a date task whose verdict depends on the clock the checker runs at.

The default model fails every date task on its own, so the cause is planted the other way
round: BAD is a recorded run of `today-report` (which never creates today's report), GOOD is
BAD forked at its first step's clock (+1h, harmless: a second, innocent delta) and then at its
last step's clock (-1d: the checker runs on the day before, whose report the setup made, so
GOOD passes). Triage must name the trace layer, and bisect the last step's clock alone."""

import json

import pytest

from tttr.app.cli import main
from tttr.engine.replay.agent import AgentLimits
from tttr.engine.replay.runs import fork, record
from tttr.engine.replay.runtime import Runtime
from tttr.sessions.store import Store

pytestmark = pytest.mark.slow  # records and forks real runs of the default model

TASK = "today-report"
SEED = 2  # its three steps never create reports/TODAY.txt


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    db = tmp_path_factory.mktemp("triage") / "session.db"
    runtime = Runtime(kernel_mode="invariant")
    with Store.open(db, create=True) as store:
        bad = record(store, TASK, runtime=runtime, seed=SEED, limits=AgentLimits(max_steps=3))
        tool_steps = sorted({e.step for e in store.events(bad.run_id) if e.kind == "tool"})
        assert bad.passed is False and len(tool_steps) >= 2, (bad.actions, bad.outcome)
        first, last = tool_steps[0], tool_steps[-1]
        moved = fork(store, bad.run_id, f"{first}:clock", "+1h", runtime=runtime)
        good = fork(store, moved.run_id, f"{last}:clock", "-1d", runtime=runtime)
        assert good.passed is True and good.actions == bad.actions, (good.actions, good.outcome)
    runtime.close()
    return db, good.run_id, bad.run_id, first, last


def _cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_triage_names_the_trace_layer_and_bisect_the_clock_the_checker_read(pair, capsys):
    db, good, bad, first, last = pair
    code, out, err = _cli(capsys, "triage", str(good), str(bad), "--db", str(db), "--json")
    assert code == 0, err
    t = json.loads(out)
    assert t["culprits"] == ["trace"] and t["verdict"].startswith("the trace layer")
    layers = {r["layer"]: r for r in t["layers"]}
    assert layers["token"]["fixed"] is None and layers["tensor"]["fixed"] is None  # no delta: not replayed
    trace = layers["trace"]
    assert [d["site"] for d in trace["deltas"]] == [f"{first}:clock", f"{last}:clock"]
    assert trace["replay"]["passed"] is True and set(trace["replay"]["applied"]) == {f"{first}:clock", f"{last}:clock"}
    with Store.open(db, create=False, readonly=True) as store:
        replay = store.run(trace["replay"]["run_id"])
        assert replay.parent == bad and replay.status == "complete" and replay.outcome["passed"] is True

    code, out, err = _cli(capsys, "bisect", str(good), str(bad), "--db", str(db), "--json")
    assert code == 0, err
    b = json.loads(out)
    assert [d["site"] for d in b["minimal"]] == [f"{last}:clock"] and b["layers"] == ["trace"]
    assert b["is_minimal"] and b["stopped"] is None and b["batched"] is True  # invariant kernels
    assert b["replays"] == len(b["tests"]) == 3  # the whole set, then each half
    assert [t["failed"] for t in b["tests"]] == [True, False, True]
    with Store.open(db, create=False, readonly=True) as store:
        assert all(store.run(t["run_id"]).parent == good for t in b["tests"])

    code, out, err = _cli(capsys, "bisect", str(good), str(bad), "--db", str(db), "--one-at-a-time")
    assert code == 0 and f"{last}:clock (trace)" in out and "replays used: 3 (tests run one at a time)" in out
    assert "round 1" in err


@pytest.mark.parametrize("argv,message", [
    (lambda g, b: ["triage", str(b), str(g)], "fails its own check on a faithful replay"),
    (lambda g, b: ["bisect", str(g), str(b), "--judge", "actions"], "took the same actions as GOOD"),
])
def test_a_good_run_that_fails_or_a_bad_run_that_does_not_is_refused(pair, capsys, argv, message):
    db, good, bad, _, _ = pair
    before = db.read_bytes()
    code, out, err = _cli(capsys, *argv(good, bad), "--db", str(db))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and message in err
    assert db.read_bytes() == before
