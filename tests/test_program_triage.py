"""`tttr triage` and `tttr bisect` on recorded programs: the deltas between two program runs
(unit, on runs written through the store), a program fork with several changes at once, and
end to end with the default model and the real sandbox: a GOOD run, a BAD one made from it by
two forks (an innocent token, a planted tool result), triage naming the trace layer and bisect
finding the tool result's site, batched or one test at a time alike."""

from __future__ import annotations

import textwrap
from datetime import timedelta
from pathlib import Path

import pytest

from tttr.app.cli import main
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import cli_json, program_tree, record_program

ARGV = ["python3", "prog.py"]


def program_run(store: Store, *, argv=ARGV, clock: str = "2026-03-02T10:01:00", result: str = "sunny",
                args: tuple = ("Paris",), tokens: tuple = (10, 11, 12), call_seed: int = 5, seed: int = 7,
                check: str | None = "grep -q picnic plan.txt", passed: bool | None = True, tool: dict | None = None) -> int:
    """A complete program run as `tttr record` writes one: a clock read (0), a model call (1),
    an @sdk.tool call (2), the program's end (3). No snapshot behind it: for the checks that
    come before any replay."""
    meta = {"source": "tttr record", "program": list(argv), "clock": "2026-03-02T10:00:00",
            **({"check": check} if check else {})}
    rid = store.begin_run(task=f"program:{argv[0]}", model_id="m", kernel_mode="invariant", seed=seed, meta=meta)
    store.append(rid, "setup:clock", {"t": "2026-03-02T10:00:00"})
    store.append(rid, "setup:setup", {"task": f"program:{argv[0]}", "clock": "2026-03-02T10:00:00",
                                                            "tree": "t0", "snapshot": "s0", "program": list(argv)})
    store.commit_step(rid)
    store.append(rid, "0:clock", {"t": clock, "source": "sdk"})
    store.commit_step(rid)
    request = {"model": "m", "messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 3}
    store.append(rid, "1:prompt", {
        "ids_digest": "d1", "n_tokens": 3, "ids": [1, 2, 3], "endpoint": "chat", "request": request,
        "sampling": {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": call_seed}, "seed_drawn": True,
        "max_tokens": 3, "stop": []})
    for pos, tid in enumerate(tokens):
        store.append(rid, f"1:token:{pos}", {"id": tid, "text": f"t{tid}", "forced": False})
    store.append(rid, "1:message", {"text": "".join(f"t{t}" for t in tokens)})
    store.commit_step(rid)
    store.append(rid, "2:tool", tool or {"function": "forecast", "args": list(args), "kwargs": {},
                                                             "result": result, "source": "sdk"})
    store.commit_step(rid)
    store.append(rid, "3:tool", {"cmd": " ".join(argv), "stdout": "", "exit_code": 0,
                                                     "tree_before": "t0", "tree_after": f"end-{result}",
                                                     "snapshot": "s1", "program": list(argv)})
    outcome = {"exit_code": 0, "calls": 1, **({"passed": passed} if passed is not None else {})}
    store.append(rid, "3:outcome", outcome)
    store.finish_run(rid, "complete", outcome)
    return rid


def _deltas(store, base: int, other: int):
    from tttr.engine.program.deltas import ProgramPair, deltas

    return deltas(ProgramPair.load(store, base, other))


def test_deltas_name_each_differing_value_with_its_layer_and_site(tmp_path):
    with Store.open(tmp_path / "s.db") as store:
        good = program_run(store)
        bad = program_run(store, clock="2026-03-02T10:02:00", result="rain", tokens=(10, 13, 14), call_seed=9, seed=8)
        found = _deltas(store, bad, good)  # GOOD's values against BAD, as triage applies them
    assert [(d.site, d.layer) for d in found] == [("0:clock", "trace"), ("1:token:1", "token"), ("2:tool", "trace"),
                                                 ("seed", "token")]
    clock, token, tool, seed = found
    assert (clock.base, clock.value) == ("2026-03-02T10:02:00", "2026-03-02T10:01:00")
    assert clock.mutation.value == "2026-03-02T10:01:00" and clock.mutation.shift == timedelta(0)
    assert (tool.base, tool.value) == ("rain", "sunny") and tool.mutation.value == {"result": "sunny"}
    assert tool.mutation.request == {"function": "forecast", "args": ["Paris"], "kwargs": {}}
    # The call is generated again: tokens before the position forced to BAD's, GOOD's at it, GOOD's seed after.
    assert token.mutation.forced == {0: 10, 1: 11} and token.mutation.settings == {"ids": [1, 2, 3], "seed": 5,
                                                                                     "max_tokens": 3}
    assert (seed.base, seed.value, seed.mutation) == (8, 7, None)


def test_a_result_for_another_request_is_a_consequence_not_a_delta(tmp_path):
    with Store.open(tmp_path / "s.db") as store:
        good = program_run(store)
        bad = program_run(store, result="rain", args=("Oslo",))
        assert _deltas(store, good, bad) == []


def test_a_shell_commands_delta_needs_the_same_files_before_and_carries_its_effects(tmp_path):
    def shell(before: str, after: str, stdout: str) -> dict:
        return {"cmd": "make", "cwd": "/work", "timeout_s": 60, "tree_before": before, "stdout": stdout,
                "stderr": "", "exit_code": 0, "tree_after": after, "snapshot": after, "source": "sdk"}

    with Store.open(tmp_path / "s.db") as store:
        good = program_run(store, tool=shell("t1", "t2", "built\n"))
        same_output = program_run(store, tool=shell("t1", "t3", "built\n"))  # other files written
        other_files = program_run(store, tool=shell("t9", "t3", "failed\n"))  # run on other files: a consequence
        found = _deltas(store, good, same_output)
        assert [d.site for d in found] == ["2:tool"]
        assert found[0].mutation.value["tree_after"] == "t3" and found[0].mutation.value["snapshot"] == "t3"
        assert found[0].mutation.request["tree_before"] == "t1"
        assert _deltas(store, good, other_files) == []


def test_a_programs_actions_are_its_sdk_tool_calls_then_its_end_tree(tmp_path):
    from tttr.engine.program.triage import program_actions

    with Store.open(tmp_path / "s.db") as store:
        sunny, rain = program_run(store), program_run(store, result="rain")
        assert program_actions(store, sunny) == ['forecast(["Paris"], {})', "end tree end-sunny"]
        assert program_actions(store, rain)[0] == program_actions(store, sunny)[0]  # the same call, other files


def test_pairs_that_cannot_be_compared_are_refused_in_one_line(tmp_path):
    from tttr.engine.program.deltas import ProgramPair, differing
    from tttr.engine.replay.deltas import DeltaError

    with Store.open(tmp_path / "s.db") as store:
        good = program_run(store)
        other_program = program_run(store, argv=["python3", "other.py"])
        same = program_run(store)
        for a, b, words in ((good, good, "same run"), (good, other_program, "different command lines")):
            with pytest.raises(DeltaError, match=words):
                ProgramPair.load(store, a, b)
        with pytest.raises(DeltaError, match="do not differ"):
            differing(ProgramPair.load(store, good, same))


def test_a_fork_plan_takes_one_change_per_site():
    from tttr.engine.program.record import ProgramRunError
    from tttr.engine.program.fork import Change, ForkPlan
    from tttr.sessions.vocabulary import Site

    one = Change(Site(2, "tool"), {"result": "x"}, "x")
    plan = ForkPlan(1, (one, Change(Site(0, "clock"), "2026-01-01T00:00:00", "t")), 5, strict=False)
    assert plan.site == Site(2, "tool") and not plan.at_setup  # the first given; the run shares its parent's start
    assert ForkPlan(1, (), 0, seed=3).at_setup and ForkPlan(1, (), 0, seed=3).run_seed(7) == 3
    with pytest.raises(ProgramRunError, match="one value per site"):
        ForkPlan(1, (one, Change(Site(2, "tool"), {"result": "y"}, "y")), 5)



@pytest.mark.parametrize("early", [False, True])
def test_an_experiments_tests_share_one_model_and_record_into_their_own_runs(monkeypatch, early):
    """A batched bisect round's programs generate calls at once: the model loads once (in the
    background from a token test's start, or on the first call) and every test's view gets it,
    while each records into its own run; a test's end leaves the model, the experiment's frees it."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from tttr.engine.program import live as program_live
    from tttr.engine.program.triage import SharedModel

    loads, go = [], threading.Event()

    class Service:
        closed = False

        def close(self):
            self.closed = True

    def load(self):
        loads.append(threading.get_ident())
        go.wait()
        self._loaded.append(Service())

    monkeypatch.setattr(program_live.LiveCalls, "_load", load)
    shared = SharedModel(None, "m")
    recorders = [SimpleNamespace(service=None) for _ in range(4)]
    views = [shared.bind(r) for r in recorders]
    with ThreadPoolExecutor(4) as pool:
        if early:
            list(pool.map(lambda v: v.start_loading(), views))
        waiting = [pool.submit(v._service) for v in views[:3]]
        try:
            starts = pool.submit(views[3].start_loading)  # a test starting while others wait for the load
            starts.result(timeout=60)  # a deadlock guard: it must not wait for the load
            assert not any(w.done() for w in waiting)
        finally:
            go.set()
        services = [w.result() for w in waiting] + [views[3]._service()]
    assert len(loads) == 1 and all(s is services[0] for s in services)
    assert [r.service for r in recorders] == services and [v.recorder for v in views] == recorders
    views[0].close()
    assert not services[0].closed
    shared.release()
    assert services[0].closed


# ------------------------------------------------------------------------------ end to end
PROGRAM = textwrap.dedent("""\
    from openai import OpenAI
    from tttr.recorders import sdk

    @sdk.tool
    def forecast(city):
        return "sunny"

    client = OpenAI()
    model = client.models.list().data[0].id
    today = sdk.now()
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Name a fruit."}],
                                       max_tokens=3)
    sky = forecast("Paris")
    plan = "picnic" if sky == "sunny" and today.weekday() < 5 else "stay in"
    open("plan.txt", "w").write(f"{today.date()} {plan} {r.choices[0].message.content!r}\\n")
    print("plan:", plan)
""")
CHECK = "grep -q picnic plan.txt"


def record_pair(capsys, tmp_path: Path) -> tuple[Path, int, int]:
    """GOOD (recorded, passes its check) and BAD: GOOD forked at a token of its model call
    (innocent: the plan does not depend on it), that forked at the tool's result (planted)."""
    db = tmp_path / "p.db"
    good = record_program(capsys, db, program_tree(tmp_path, "tree", PROGRAM), "--check", CHECK, program=ARGV)
    assert good["passed"] is True and good["calls"] == 1, good
    with Store.open(db, readonly=True) as store:
        _, events = store.load_run(good["run_id"])
        first = next(e.value["id"] for e in events if e.site == "1:token:1")
    innocent = cli_json(capsys, ["fork", str(good["run_id"]), "--db", str(db), "--at", "1:token:1",
                                 "--set", str(5 if first != 5 else 6), "--json"])
    bad = cli_json(capsys, ["fork", str(innocent["run_id"]), "--db", str(db), "--at", "2:tool", "--set", "rain",
                            "--json"])
    with Store.open(db, readonly=True) as store:
        assert store.run(innocent["run_id"]).outcome["passed"] is True  # the fork re-ran the recorded check
        assert store.run(bad["run_id"]).outcome["passed"] is False
    return db, good["run_id"], bad["run_id"]


@pytest.mark.slow
@needs_sandbox
def test_triage_names_the_planted_layer_and_bisect_finds_the_planted_site(tmp_path, capsys, monkeypatch):
    """bisect twice: batched (the default) and --one-at-a-time, with the same results."""
    from tttr.engine.program.triage import SharedModel

    db, good, bad = record_pair(capsys, tmp_path)
    with Store.open(db, readonly=True) as store:
        before = {r.id for r in store.runs()}

    triaged = cli_json(capsys, ["triage", str(good), str(bad), "--db", str(db), "--json"])
    triaged_alone = cli_json(capsys, ["triage", str(good), str(bad), "--db", str(db), "--one-at-a-time", "--json"])
    for res in (triaged, triaged_alone):
        layers = {r["layer"]: r for r in res["layers"]}
        assert res["culprits"] == ["trace"], res["verdict"]
        assert [r["layer"] for r in res["layers"]] == ["tensor", "token", "trace"]
        assert [d["site"] for d in layers["trace"]["deltas"]] == ["2:tool"]
        assert [d["site"] for d in layers["token"]["deltas"]] == ["1:token:1"] and layers["token"]["fixed"] is False
        assert layers["tensor"]["replay"] is None  # every call served under invariant kernels: nothing differs
    assert triaged["batched"] is True and "side by side" in triaged["batch_note"]
    assert triaged_alone["batched"] is False and "one at a time" in triaged_alone["batch_note"]

    passes = []  # the shared engine's forward passes: (rows, the sequences in it) each
    release = SharedModel.release

    def keep_passes(self):
        if self._loader.service is not None:
            passes.extend(self._loader.service.engine.history)
        release(self)

    monkeypatch.setattr(SharedModel, "release", keep_passes)
    res = cli_json(capsys, ["bisect", str(good), str(bad), "--db", str(db), "--json"])
    batched_passes, passes[:] = list(passes), []
    alone = cli_json(capsys, ["bisect", str(good), str(bad), "--db", str(db), "--one-at-a-time", "--json"])
    for r in (res, alone):
        assert [d["site"] for d in r["minimal"]] == ["2:tool"] and r["layers"] == ["trace"] and r["is_minimal"]
        assert r["replays"] == len(r["tests"]) >= 3
    assert res["batched"] is True and "batched through one engine" in res["batch_note"]
    assert alone["batched"] is False and "one at a time" in alone["batch_note"]
    # The whole set and its token half, run at once, each generate call 1: on one engine (after its
    # warm-up pass), whose passes they share when the calls overlap; one at a time, they never do.
    assert len({i for _, ids in batched_passes[1:] for i in ids}) >= 2, batched_passes
    assert not any(len(ids) > 1 for _, ids in passes)

    with Store.open(db, readonly=True) as store:  # each tested replay is a stored run, a child of the one replayed
        tested = [r for r in store.runs() if r.id not in before]
        assert len(tested) == 4 + res["replays"] + alone["replays"]  # the triages' two layers each, the bisects' tests
        assert all(r.status == "complete" and r.parent in (good, bad) for r in tested)
        whole = store.run(res["tests"][0]["run_id"])  # BAD's two deltas on GOOD: its token and its tool result
        assert whole.parent == good and whole.outcome["passed"] is False
        assert whole.outcome["applied"] == ["1:token:1", "2:tool"]
        _, bad_events = store.load_run(bad)
        assert stored(store, whole.id)[0] == [(e.site, e.value["id"]) for e in bad_events if e.kind == "token"]
        # Batched or one at a time, each subset tested gets the same verdict, tokens and logits digests.
        by_subset = {tuple(t["deltas"]): t for t in res["tests"]}
        assert set(by_subset) == {tuple(t["deltas"]) for t in alone["tests"]}
        for t in alone["tests"]:
            twin = by_subset[tuple(t["deltas"])]
            assert (twin["failed"], twin["passed"]) == (t["failed"], t["passed"])
            assert stored(store, twin["run_id"]) == stored(store, t["run_id"])
        assert any(stored(store, t["run_id"])[1] for t in alone["tests"])  # live calls' logits were stored
        # Likewise each layer's replay, side by side or one at a time (the token layer's call is live).
        for a, b in zip(triaged["layers"][1:], triaged_alone["layers"][1:]):
            assert (a["fixed"], a["replay"]["passed"]) == (b["fixed"], b["replay"]["passed"])
            assert stored(store, a["replay"]["run_id"]) == stored(store, b["replay"]["run_id"])
        assert stored(store, triaged["layers"][1]["replay"]["run_id"])[1]  # the token layer's live logits


def stored(store, run_id: int) -> tuple[list, list]:
    """A run's sampled tokens and logits digests, by site."""
    _, events = store.load_run(run_id)
    return ([(e.site, e.value["id"]) for e in events if e.kind == "token"],
            [(e.site, e.value["digest"]) for e in events if e.kind == "logits"])


@pytest.mark.slow
@needs_sandbox
def test_a_good_run_that_fails_its_check_when_replayed_is_refused_and_nothing_is_written(tmp_path, capsys):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "prog.py").write_text(textwrap.dedent("""\
        import os
        from tttr.recorders import sdk
        day = sdk.now()
        open("out.txt", "w").write("replayed" if os.environ.get("TTTR_REPLAY") else f"ok {day.date()}")
    """))
    db = tmp_path / "f.db"
    good = cli_json(capsys, ["record", "--db", str(db), "--tree", str(tree), "--clock", "2026-03-02T10:00:00",
                             "--check", "grep -q ok out.txt", "--json", "--", *ARGV])["run_id"]
    bad = cli_json(capsys, ["fork", str(good), "--db", str(db), "--at", "0:clock", "--set", "+1d", "--json"])["run_id"]
    with Store.open(db, readonly=True) as store:
        runs = len(store.runs())
    for command in ("triage", "bisect"):
        assert main([command, str(good), str(bad), "--db", str(db)]) == 2
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1 and "fails on a faithful replay" in lines[0] and captured.out == "", captured.err
    with Store.open(db, readonly=True) as store:
        assert len(store.runs()) == runs


def test_the_app_takes_two_recorded_programs_to_their_triage_and_refuses_a_pair_without_differences(tmp_path):
    from textual.widgets import DataTable

    from tests.app_helpers import run_app, wait_for
    from tttr.app.screens.triage import ExperimentScreen

    db = tmp_path / "programs.db"
    with Store.open(db) as store:
        a, b = program_run(store), program_run(store)
    before = db.read_bytes()

    async def flow(app, pilot):
        table = app.screen.query_one(DataTable)
        for rid in (a, b):
            table.move_cursor(row=table.get_row_index(str(rid)))
            await pilot.pause()
            await pilot.press("space")
            await pilot.pause()
        await pilot.press("T")
        await wait_for(pilot, lambda: isinstance(app.screen, ExperimentScreen) and app.screen.error is not None)
        assert "do not differ at any clock read, comparable SDK tool result" in app.screen.error  # the program's deltas

    run_app(db, flow, load_tokenizer=False)
    assert db.read_bytes() == before


def test_an_experiments_changes_apply_at_their_steps_or_where_their_request_comes_again():
    """Not strict: a clock change moves only its own read; after the divergence a tool change
    applies to the live call that asks what it asked."""
    from types import SimpleNamespace

    from tttr.engine.program.fork import Change, ForkPlan
    from tttr.engine.program.replay import _Recording, _Step
    from tttr.sessions.vocabulary import Site

    def step(n, kind, value):
        return _Step(n, kind, [SimpleNamespace(kind=kind, site=f"{n}:{kind}", value=value, step=n)])

    run = SimpleNamespace(id=1, model_id="m", meta={"clock": "2026-03-02T10:00:00"})
    rec = _Recording(run, {"clock": "2026-03-02T10:00:00"}, [
        step(0, "clock", {"t": "2026-03-02T10:00:01"}),
        step(1, "tool", {"function": "f", "args": [1], "kwargs": {}, "result": "a"}),
        step(2, "clock", {"t": "2026-03-02T10:00:02"}),
        step(3, "tool", {"function": "g", "args": [], "kwargs": {}, "result": "b"}),
    ], {}, None)
    copied = []
    recorder = SimpleNamespace(record_copy=lambda name, events: copied.append(events), service=None)
    plan = ForkPlan(1, (Change(Site(0, "clock"), "2026-03-03T09:00:00", "t", shift=timedelta(hours=23)),
                        Change(Site(3, "tool"), {"result": "B"}, "r",
                               request={"function": "g", "args": [], "kwargs": {}})), 0, strict=False)
    replayer = plan.replayer(rec, recorder, "program:python3")
    try:
        assert replayer.answer_sdk("p", "clock", {}) == {"t": "2026-03-03T09:00:00"}
        assert replayer.answer_sdk("p", "tool", {"function": "f", "args": [1], "kwargs": {}}) == {"result": "a"}
        assert replayer.answer_sdk("p", "clock", {}) == {"t": "2026-03-02T10:00:02"}  # not moved
        assert replayer.answer_sdk("p", "tool", {"function": "h", "args": [], "kwargs": {}}) is None  # diverged: live
        assert replayer.divergence is not None
        assert replayer.answer_sdk("p", "tool", {"function": "g", "args": [], "kwargs": {}}) == {"result": "B"}
        assert replayer.report()["applied"] == ["0:clock", "3:tool"]
        assert copied[-1] == [("tool", None, {"function": "g", "args": [], "kwargs": {}, "result": "B",
                                              "source": "sdk"})]
    finally:
        replayer.close()
