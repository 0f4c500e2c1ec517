"""Locate the layer and bisect, end to end on the embedded default model, the real sandbox and
a real session database: a date task whose verdict depends on the clock the checker runs at.

The default model fails every date task on its own, so the cause is planted the other way
round: BAD is a recorded run of `today-report` (which never creates today's report), GOOD is
BAD forked at its first step's clock (+1h, harmless: a second, innocent delta) and then at its
last step's clock (-1d: the checker runs on the day before, whose report the setup made, so
GOOD passes). Triage must name the trace layer, and bisect the last step's clock alone.

First, without a model: the layers' replays side by side (`replay_layers`) against one at a time."""

import json
import threading

import pytest

from tttr.app.cli import main
from tttr.engine.replay.agent import AgentLimits
from tttr.engine.replay.runs import fork, record
from tttr.engine.replay.bisect import choose_batching
from tttr.engine.replay.deltas import Delta
from tttr.engine.replay.runtime import Runtime
from tttr.engine.replay.triage import BATCHED, ONE_LAYER, Triage, replay_layers
from tttr.engine.replay.trial import Trial
from tttr.sessions.store import Store

# ------------------------------------------------------------------------ the layers at once, no model
FOUND = [Delta("0:token:1", "token", 5, 6), Delta("seed", "token", 1, 2), Delta("1:clock", "trace", "a", "b"),
         Delta("2:tool", "trace", "x", "y")]  # no tensor delta: that layer is not replayed


def _triage(modes: set[str], *, finish_first: str = "trace", cancel_at: str | None = None):
    """`replay_layers` with a replay that fails unless GOOD's token values are in. Side by side,
    the replays wait for each other (they must run at once) and the layer `finish_first`
    finishes before the other. `cancel_at`: `on_layer` raises when that layer is reported, and
    the other replay runs until it is told to stop. Returns the Triage (None if it raised),
    the layers in the order `on_layer` heard of them, the replaying threads and the stop event."""
    out = Triage(2, 1, "outcome")
    choose_batching(out, modes, True, BATCHED)
    heard, threads, stop = [], set(), threading.Event()
    reported = {layer: threading.Event() for layer in ("token", "trace")}
    both = threading.Barrier(2, timeout=60)  # a deadlock guard, not a time limit

    def replay(subset):
        layer = subset[0].layer
        threads.add(threading.get_ident())
        if out.batched:
            both.wait()
            other = "trace" if layer == "token" else "token"
            if layer != finish_first and cancel_at is None:
                assert reported[other].wait(60)
            if cancel_at is not None and layer != cancel_at:
                assert stop.wait(60)  # runs until the raise stops it
        fixed = layer == "token" and not stop.is_set()
        status = "incomplete" if stop.is_set() else "complete"
        return Trial(10 + len(subset), list(subset), [d.site for d in subset], fixed, [], not fixed, {"status": status})

    def on_layer(r):
        heard.append(r.layer)
        if r.layer in reported:
            reported[r.layer].set()
        if r.layer == cancel_at:
            raise KeyboardInterrupt

    try:
        res = replay_layers(out, FOUND, replay, stop=stop, on_layer=on_layer)
    except KeyboardInterrupt:
        res = None
    return res, heard, threads, stop


@pytest.mark.parametrize("finish_first", ["trace", "token"])
def test_the_layers_replayed_side_by_side_give_the_one_at_a_time_triage_in_the_layers_order(finish_first):
    batched, heard, threads, _ = _triage({"invariant"}, finish_first=finish_first)
    alone, heard_alone, threads_alone, _ = _triage({"invariant", "fast"})
    assert batched.batched and batched.batch_note == BATCHED
    assert not alone.batched and "fast kernels are not batch-invariant" in alone.batch_note
    strip = {"batched", "batch_note"}
    assert {k: v for k, v in batched.to_json().items() if k not in strip} == \
        {k: v for k, v in alone.to_json().items() if k not in strip}
    assert [r.layer for r in batched.layers] == ["tensor", "token", "trace"]
    assert batched.culprits == ["token"] and batched.layers[0].trial is None
    assert [r.trial.run_id for r in batched.layers[1:]] == [12, 12] and batched.verdict() == alone.verdict()
    # Heard as each finished: the layer without deltas first; one at a time, in the layers' order.
    assert heard == ["tensor", finish_first, "token" if finish_first == "trace" else "trace"]
    assert heard_alone == ["tensor", "token", "trace"]
    assert len(threads) == 2 and threading.get_ident() not in threads and threads_alone == {threading.get_ident()}


def test_a_single_layer_to_replay_is_replayed_alone():
    out = Triage(2, 1, "outcome")
    choose_batching(out, {"invariant"}, True, BATCHED)
    threads = []

    def replay(subset):
        threads.append(threading.get_ident())
        return Trial(9, list(subset), [], True, [], False, {"status": "complete"})

    res = replay_layers(out, FOUND[2:], replay, stop=threading.Event())
    assert not res.batched and res.batch_note == ONE_LAYER and res.culprits == ["trace"]
    assert threads == [threading.get_ident()]


def test_a_stop_while_the_layers_run_side_by_side_reports_the_replay_in_flight_and_raises():
    res, heard, _, stop = _triage({"invariant"}, cancel_at="trace")
    assert res is None and stop.is_set()  # the raise went on, once the other replay had stopped
    assert heard == ["tensor", "trace", "token"]  # the stopped replay (an incomplete run) is still reported


def test_a_layer_whose_replay_was_cut_has_no_verdict_and_is_no_culprit(capsys):
    from tttr.app.commands.experiments import _fixed
    from tttr.engine.replay.triage import LayerResult

    token, trace = FOUND[1:2], FOUND[2:]
    cut = LayerResult("token", token, Trial(5, token, [], None, [], True, {"status": "incomplete"}))
    done = LayerResult("trace", trace, Trial(6, trace, [], True, [], False, {"status": "complete"}))
    assert cut.cut and cut.fixed is None and not done.cut and done.fixed is True
    out = Triage(2, 1, "outcome", [LayerResult("tensor", [], None), cut, done])
    assert out.culprits == ["trace"] and out.to_json()["layers"][1]["fixed"] is None
    assert "no verdict" in _fixed(type("Args", (), {"judge": "outcome"}), cut.fixed)  # not "still fails"


# ------------------------------------------------------------------------ end to end, the default model
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


@pytest.mark.slow  # records and forks real runs of the default model
def test_triage_names_the_trace_layer_and_bisect_the_clock_the_checker_read(pair, capsys):
    db, good, bad, first, last = pair
    code, out, err = _cli(capsys, "triage", str(good), str(bad), "--db", str(db), "--json")
    assert code == 0, err
    t = json.loads(out)
    assert t["culprits"] == ["trace"] and t["verdict"].startswith("the trace layer")
    layers = {r["layer"]: r for r in t["layers"]}
    assert layers["token"]["fixed"] is None and layers["tensor"]["fixed"] is None  # no delta: not replayed
    assert t["batched"] is False and t["batch_note"] == ONE_LAYER  # one replay: nothing to run beside it
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("verb,base_is_bad", [("triage", True), ("bisect", False)])
def test_an_experiments_check_finds_its_deltas_through_the_kind_and_decodes_each_run_once(pair, monkeypatch,
                                                                                          verb, base_is_bad):
    """The check asks the run's kind for the pair and its deltas (`compare`, what `kind.deltas`
    answers), decodes GOOD and BAD once each, and opens nothing beyond the reader it is given."""
    from collections import Counter

    from tttr.engine.kinds import AGENT, ExperimentRequest, kind_of
    from tttr.engine.replay.source import Source

    db, good, bad, first, last = pair
    counts, compared = Counter(), []
    load_run, source_init, compare = Store.load_run, Source.__init__, type(AGENT).compare

    def spied_compare(self, reader, base, other):
        compared.append((base, other))
        return compare(self, reader, base, other)

    monkeypatch.setattr(Store, "load_run", lambda self, *a, **kw: counts.update(["decodes"]) or load_run(self, *a, **kw))
    monkeypatch.setattr(Source, "__init__", lambda self, *a, **kw: counts.update(["sources"]) or source_init(self, *a, **kw))
    monkeypatch.setattr(type(AGENT), "compare", spied_compare)
    with Store.open(db, create=False, readonly=True) as reader:
        open_ = Store.open.__func__
        monkeypatch.setattr(Store, "open", classmethod(lambda cls, *a, **kw: counts.update(["opens"]) or open_(cls, *a, **kw)))
        kind = kind_of(reader.run(bad))
        assert kind is AGENT
        expected = AGENT.deltas(reader, *((bad, good) if base_is_bad else (good, bad)))
        compared.clear(), counts.clear()
        kind.check_experiment(reader, str(db), verb, ExperimentRequest(good, bad))
    assert compared == [(bad, good) if base_is_bad else (good, bad)]
    assert counts == Counter({"decodes": 2, "sources": 2}), counts  # no open: the reader given
    assert {d.site for d in expected} >= {f"{first}:clock", f"{last}:clock"}


@pytest.mark.slow
@pytest.mark.parametrize("verb", ["triage", "bisect"])
def test_an_experiment_acts_on_its_check_without_replaying_good_again(pair, monkeypatch, verb):
    """GOOD's faithful replay (check_ends) runs once, in the check: acting on the plan reads the
    pair through its write connection (Source.on) and neither decodes nor replays it again."""
    from collections import Counter

    from tttr.engine.kinds import ExperimentRequest, kind_of
    from tttr.engine.replay import bisect as bisect_module
    from tttr.engine.replay import triage as triage_module

    db, good, bad, _, _ = pair
    counts = Counter()
    check_ends, load_run = triage_module.check_ends, Store.load_run
    for module in (triage_module, bisect_module):
        monkeypatch.setattr(module, "check_ends", lambda *a, **kw: counts.update(["check_ends"]) or check_ends(*a, **kw))
    with Store.open(db, create=False, readonly=True) as reader:
        kind = kind_of(reader.run(bad))
        plan = kind.check_experiment(reader, str(db), verb, ExperimentRequest(good, bad, max_replays=1))
    assert counts == Counter({"check_ends": 1})
    monkeypatch.setattr(Store, "load_run", lambda self, rid, *a, **kw: counts.update([f"decode {rid}"]) or
                        load_run(self, rid, *a, **kw))
    result = kind.triage(str(db), plan) if verb == "triage" else kind.bisect(str(db), plan)
    assert counts["check_ends"] == 1 and counts[f"decode {good}"] == 0 and counts[f"decode {bad}"] == 0, counts
    assert result.good == good and result.bad == bad
