"""Bisect's parts, one at a time: ddmin with fakes of the test function, the deltas between
two hand-written recordings in a real SQLite store, the oracle's set of mutations, and the
refusals of `tttr triage` / `tttr bisect` (one line, exit 2, nothing written)."""

from __future__ import annotations

import itertools

import pytest

from tttr.app.cli import main
from tttr.engine.replay.bisect import ddmin
from tttr.engine.replay.deltas import KERNELS, SEED, DeltaError, Pair, by_layer, deltas, differing, mutation_set
from tttr.engine.replay.mutation import Mutation, MutationError
from tttr.engine.replay.mutations import MutationSet
from tttr.sessions.store import Store
from tttr.sessions.vocabulary import Site


# ---------------------------------------------------------------------------- ddmin
def _culprit(*needed):
    """A fake test: the failure appears when every item of `needed` is in the subset."""
    calls = []

    def fails(subset):
        calls.append(list(subset))
        return set(needed) <= set(subset)

    return fails, calls


@pytest.mark.parametrize("n,cause", [(1, 0), (2, 1), (8, 5), (16, 0), (13, 12)])
def test_ddmin_finds_a_single_cause_within_2_log2_n_tests(n, cause):
    import math

    fails, calls = _culprit(cause)
    res = ddmin(list(range(n)), fails)
    assert res.items == [cause] and res.minimal and res.stopped is None
    assert res.tests == len(calls) <= 2 * math.ceil(math.log2(max(n, 2)))


@pytest.mark.parametrize("needed", [(2, 9), (0, 1, 15), (4, 5)])
def test_ddmin_finds_an_interaction_and_the_result_is_1_minimal(needed):
    fails, calls = _culprit(*needed)
    res = ddmin(list(range(16)), fails)
    assert sorted(res.items) == sorted(needed) and res.minimal
    assert len({tuple(c) for c in calls}) == len(calls) == res.tests  # no subset tested twice
    for i in range(len(res.items)):  # removing any one makes the failure disappear
        assert not fails(res.items[:i] + res.items[i + 1:])


@pytest.mark.parametrize("needed", [(5,), (2, 9)])
def test_batched_ddmin_tests_a_round_together_and_finds_the_same_set(needed):
    fails, calls = _culprit(*needed)
    batches = []

    def fails_many(subsets):
        batches.append(len(subsets))
        return [fails(s) for s in subsets]

    res = ddmin(list(range(16)), fails, fails_many=fails_many)
    one_at_a_time = ddmin(list(range(16)), _culprit(*needed)[0])
    assert sorted(res.items) == sorted(one_at_a_time.items) == sorted(needed) and res.minimal
    assert batches and all(b > 1 for b in batches) and res.tests == len(calls)
    assert len({tuple(c) for c in calls}) == len(calls)


def test_known_results_are_not_tested_again_and_count_as_tests():
    fails, calls = _culprit(3)
    items = list(range(8))
    res = ddmin(items, fails, known=[(items[:4], True), (items[4:], False)])
    assert res.items == [3] and res.minimal
    assert [0, 1, 2, 3] not in calls and [4, 5, 6, 7] not in calls and res.tests == len(calls) + 2


def test_ddmin_stops_at_the_budget_with_the_best_failing_set_so_far():
    fails, calls = _culprit(11)
    res = ddmin(list(range(16)), fails, max_tests=2)
    assert res.stopped == "budget" and not res.minimal and res.tests == 2 == len(calls)
    assert 11 in res.items and len(res.items) < 16


# ---------------------------------------------------------------------------- the round driver
def _rounds(needed, *, batched: bool, interrupt=None):
    """`run_rounds` (shared by the agent's and a program's bisect) with a fake test whose
    trials fail when every item of `needed` is in the subset; `interrupt`: the subset whose
    test is stopped by Ctrl-C. Batched, the first round's three tests (the whole set and its
    halves) wait for each other: they must run at once. Returns the Bisect, the subsets tested,
    and the threads used."""
    import threading

    from tttr.engine.replay.bisect import Bisect, run_rounds
    from tttr.engine.replay.deltas import Delta
    from tttr.engine.replay.trial import Trial

    found = [Delta(f"{i}:clock", "trace", "a", "b") for i in range(8)]
    out = Bisect(1, 2, "outcome", found, batched=batched)
    threads, tested, seen = set(), [], []
    first_round = threading.Barrier(3, timeout=60)  # a deadlock guard, not a time limit

    def test(subset):
        threads.add(threading.get_ident())
        tested.append([found.index(d) for d in subset])
        if batched and len(tested) <= 3:
            first_round.wait()
        if interrupt is not None and [found.index(d) for d in subset] == list(interrupt):
            raise KeyboardInterrupt
        failed = set(needed) <= {found.index(d) for d in subset}
        return Trial(len(tested), list(subset), [], not failed, [], failed, {"status": "complete"})

    run_rounds(out, test, max_replays=50, stop=threading.Event(), on_trial=seen.append)
    assert seen == out.trials or interrupt is not None
    return out, tested, threads


@pytest.mark.parametrize("needed", [(5,), (2, 6)])
def test_the_round_driver_batched_runs_tests_in_threads_and_finds_the_one_at_a_time_set(needed):
    import threading

    batched, tested, threads = _rounds(needed, batched=True)
    alone, tested_alone, threads_alone = _rounds(needed, batched=False)
    assert [d.site for d in batched.result.items] == [d.site for d in alone.result.items]
    assert sorted(batched.result.items[i].site for i in range(len(needed))) == sorted(f"{n}:clock" for n in needed)
    assert batched.result.minimal and alone.result.minimal
    assert tested[0] == list(range(8)) and tested_alone[0] == list(range(8))  # the whole set first
    assert threading.get_ident() not in threads and threads_alone == {threading.get_ident()}
    verdicts = {tuple(d.site for d in t.deltas): t.failed for t in batched.trials}
    for t in alone.trials:  # every test both ran has the same outcome
        assert verdicts[tuple(d.site for d in t.deltas)] == t.failed


def test_ctrl_c_in_a_batched_round_keeps_the_finished_tests_and_the_best_set_so_far():
    out, tested, _ = _rounds((5,), batched=True, interrupt=(0, 1, 2, 3))  # Ctrl-C while a half is tested
    assert out.result.stopped == "interrupted" and not out.result.minimal
    assert len(out.result.items) == 8  # the whole set failed: the best so far
    assert [len(t.deltas) for t in out.trials] == [8, 4]  # the whole set and the other half: listed



def test_ddmin_keeps_the_best_set_when_interrupted():
    counter = itertools.count()

    def fails(subset):
        if next(counter) == 3:
            raise KeyboardInterrupt
        return 6 in subset

    rounds = []
    res = ddmin(list(range(16)), fails, on_round=lambda r, n, cur, t: rounds.append((r, len(cur), t)))
    assert res.stopped == "interrupted" and 6 in res.items and len(res.items) <= 4
    assert rounds[0] == (1, 16, 0) and [r for r, _, _ in rounds] == list(range(1, len(rounds) + 1))


# ---------------------------------------------------------------------------- deltas, in a real store
def _run(store, *, seed=1, task="today-report", model="m", kernels="invariant", revision=3,
         clocks=("2026-11-29T10:00:00", "2026-11-29T10:00:05"), out="a\n", tree0="T0", prompt1="P1",
         tokens1=(5, 6, 7), passed=True, status="complete"):
    rid = store.begin_run(task=task, model_id=model, kernel_mode=kernels, seed=seed,
                          sampling={"temperature": 0.7, "top_p": 1.0, "top_k": 0},
                          fingerprint={"kernels_revision": revision})
    store.append(rid, "setup:clock", {"t": "2026-11-29T10:00:00"})
    store.append(rid, "setup:setup", {"tree": tree0, "clock": "2026-11-29T10:00:00"})
    store.commit_step(rid)
    for step, clock in enumerate(clocks):
        store.append(rid, f"{step}:prompt", {"ids_digest": "P0" if step == 0 else prompt1})
        for pos, tid in enumerate((1, 2) if step == 0 else tokens1):
            store.append(rid, f"{step}:token:{pos}", {"id": tid, "text": f"t{tid}"})
        store.append(rid, f"{step}:action", {"cmd": f"ls {step}"})
        store.append(rid, f"{step}:clock", {"t": clock})
        store.append(rid, f"{step}:tool",
                     {"cmd": f"ls {step}", "cwd": "/work", "exports": {}, "tree_before": tree0,
                      "tree_after": tree0, "stdout": out if step == 0 else "", "stderr": "", "exit_code": 0})
        store.commit_step(rid)
    store.finish_run(rid, status, {"passed": passed})
    return rid


@pytest.fixture
def store(tmp_path):
    with Store.open(tmp_path / "s.db") as s:
        yield s


def test_deltas_name_each_differing_value_with_its_layer(store):
    a = _run(store)
    b = _run(store, seed=2, kernels="fast", clocks=("2026-11-29T10:00:00", "2026-12-29T10:00:05"),
             out="b\n", tokens1=(5, 9, 8))
    found = deltas(Pair.load(store, a, b))
    assert [d.site for d in found] == ["0:tool", "1:token:1", "1:clock", KERNELS, SEED]
    assert {k: [d.site for d in v] for k, v in by_layer(found).items()} == {
        "tensor": [KERNELS], "token": ["1:token:1", SEED], "trace": ["0:tool", "1:clock"]}
    tool = found[0]
    assert tool.mutation.value["stdout"] == "b\n" and tool.mutation.value["cmd"] == "ls 0"  # b's value, on a's request
    assert found[1].mutation.value == 9 and found[1].mutation.site == Site(1, "token", 1)
    assert found[1].describe() == '1:token:1 (token): "t6" (6) → "t9" (9)'  # text, its id beside it (bisect prints it)
    assert (found[4].base, found[4].value) == (1, 2)
    assert len(mutation_set(found).mutations) == 3  # seed and kernels are not site mutations


def test_a_tool_result_on_another_request_or_tokens_in_another_context_are_consequences(store):
    a = _run(store)
    b = _run(store, tree0="T1", out="b\n", prompt1="P2", tokens1=(9, 9, 9))  # another tree, another prompt
    assert deltas(Pair.load(store, a, b)) == []
    with pytest.raises(DeltaError, match="do not differ"):
        differing(Pair.load(store, a, b))


@pytest.mark.parametrize("other,what", [
    (dict(task="make-dir"), "different tasks"), (dict(model="m2"), "different models"),
    (dict(revision=4), "different kernels revisions"), (dict(status="incomplete"), "is incomplete"),
])
def test_pairs_that_cannot_be_compared_are_refused(store, other, what):
    a = _run(store)
    b = _run(store, **other)
    with pytest.raises(DeltaError, match=what):
        Pair.load(store, a, b)


# ---------------------------------------------------------------------------- the oracle's set of mutations
def test_a_mutation_set_answers_per_site_and_checks_the_request():
    import datetime

    clock = Mutation(Site(2, "clock"), datetime.datetime(2026, 1, 1), "x")
    tool = Mutation(Site(1, "tool"), {"cmd": "ls", "tree_before": "T", "stdout": "y"}, "y")
    s = MutationSet((clock, tool))
    assert s.at("clock", 2) and not s.at("clock", 1) and s.get("tool", 1) is tool
    assert s.tool(1, {"cmd": "ls", "tree_before": "T"}) is tool
    assert s.tool(1, {"cmd": "ls -l", "tree_before": "T"}) is None  # another request: not applied
    assert s.tool(1, {"cmd": "ls", "tree_before": "U"}) is None
    assert MutationSet.of(clock).strict and not s.strict and not MutationSet.of(None)
    with pytest.raises(MutationError, match="two mutations"):
        MutationSet((clock, Mutation(Site(2, "clock"), datetime.datetime(2026, 1, 2), "z")))


# ---------------------------------------------------------------------------- the commands' refusals
@pytest.mark.parametrize("command", ["triage", "bisect"])
@pytest.mark.parametrize("other,message", [
    (dict(task="make-dir"), "different tasks"), (dict(tree0="T1", out="b\n", prompt1="Q"), "do not differ"),
])
def test_refused_pairs_exit_2_with_one_line_and_write_nothing(tmp_path, capsys, command, other, message):
    path = tmp_path / "s.db"
    with Store.open(path) as s:
        a, b = _run(s), _run(s, **other)
    before = path.read_bytes()
    assert main([command, str(a), str(b), "--db", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert path.read_bytes() == before
    with Store.open(path) as s:
        assert len(s.runs()) == 2


# ---------------------------------------------------------------------------- batched = one at a time, end to end
@pytest.mark.slow  # records, forks and replays real runs of the default model
def test_batched_and_one_at_a_time_bisects_and_triages_store_the_same_runs_and_verdict(tmp_path):
    """A token plant (live generation from step 0) beside an innocent clock shift, judged by
    actions: the batched bisect's tests share passes with each other, and every test it has in
    common with the one-at-a-time bisect stored the same tokens, logits digests, actions and
    outcome. Likewise triage's two layer replays, side by side and one at a time."""
    from tttr.engine.replay.agent import AgentLimits
    from tttr.engine.bench.bisect import runner_up
    from tttr.engine.replay.bisect import bisect
    from tttr.engine.replay.runs import fork, record
    from tttr.engine.replay.runtime import Runtime
    from tttr.engine.replay.triage import triage

    runtime = Runtime(kernel_mode="invariant")
    try:
        with Store.open(tmp_path / "s.db") as store:
            good = record(store, "write-line", runtime=runtime, seed=2, limits=AgentLimits(max_steps=2)).run_id
            shifted = fork(store, good, "0:clock", "+1h", runtime=runtime).run_id
            bad = fork(store, shifted, "0:token:0", str(runner_up(store, shifted, 0, 0)), runtime=runtime).run_id
            passes = runtime.engine.steps
            batched = bisect(store, good, bad, judge="actions", runtime=runtime, batch=True)
            shared = [h for h in list(runtime.engine.history)[-(runtime.engine.steps - passes):] if len(h[1]) > 1]
            alone = bisect(store, good, bad, judge="actions", runtime=runtime, batch=False)

            assert batched.batched and not alone.batched
            assert [d.site for d in batched.result.items] == [d.site for d in alone.result.items] == ["0:token:0"]
            assert shared, "the batched tests never shared a forward pass"

            def stored(trial):
                tokens = [(e.site, e.value["id"]) for e in store.events(trial.run_id, kind="token")]
                digests = [(e.site, e.value["digest"]) for e in store.events(trial.run_id, kind="logits")]
                return tokens, digests, trial.actions, store.run(trial.run_id).outcome

            by_sites = {tuple(d.site for d in t.deltas): t for t in batched.trials}
            assert len(alone.trials) >= 2
            for t in alone.trials:
                twin = by_sites[tuple(d.site for d in t.deltas)]
                assert stored(twin) == stored(t) and twin.failed == t.failed
                assert any(token for token in stored(t)[0])  # live tokens were stored

            # (Whether the two replays share a pass depends on when their live steps meet: the trace
            # layer's generates from step 1, the token layer's from step 0. Not asserted.)
            side_by_side = triage(store, good, bad, judge="actions", runtime=runtime)
            one_by_one = triage(store, good, bad, judge="actions", runtime=runtime, batch=False)
            assert side_by_side.batched and not one_by_one.batched
            assert side_by_side.culprits == one_by_one.culprits == ["token"], side_by_side.verdict()
            assert [r.layer for r in side_by_side.layers] == ["tensor", "token", "trace"]
            for a, b in zip(side_by_side.layers, one_by_one.layers):
                assert (a.layer, [d.site for d in a.deltas], a.fixed) == (b.layer, [d.site for d in b.deltas], b.fixed)
                assert (a.trial is None) == (b.trial is None) == (a.layer == "tensor")
                if a.trial is not None:
                    assert stored(a.trial) == stored(b.trial) and store.run(a.trial.run_id).parent == bad
    finally:
        runtime.close()


def test_ctrl_c_before_the_whole_set_failed_says_there_is_no_set_yet(monkeypatch, capsys):
    from argparse import Namespace

    from tttr.app.commands import experiments

    def interrupted(args):
        raise KeyboardInterrupt  # as run_rounds raises it while the whole set's first test runs

    monkeypatch.setattr(experiments, "_bisect", interrupted)
    assert experiments.cmd_bisect(Namespace(good=1, bad=2, db="s.db")) == 130
    err = capsys.readouterr().err
    assert "interrupted before BAD run 2's differences were seen to make GOOD run 1 fail" in err
    assert "no set yet" in err and "tttr runs --db s.db" in err


def test_deltas_are_counted_in_words_a_lineage_reads():
    from tttr.engine.replay.deltas import counted

    assert (counted(1), counted(2), counted(0)) == ("1 delta", "2 deltas", "0 deltas")
