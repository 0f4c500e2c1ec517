"""A run's kind is asked once (tttr.engine.kinds.kind_of) and called: the command line and the
terminal app hold no "which kind is this run?" of their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tttr.engine.kinds import AGENT, CALLS, KINDS, PROGRAM, ForkRequest, KindError, ReplayRequest, kind_of
from tttr.engine.replay.policy import Policy
from tttr.sessions.errors import TTTRError
from tttr.sessions.store import Store

ROOT = Path(__file__).resolve().parent.parent


def _runs(tmp_path) -> tuple[Path, dict[str, int]]:
    db = tmp_path / "kinds.db"
    with Store.open(db, create=True) as store:
        ids = {
            "agent": store.begin_run(task="write-line", model_id="m", kernel_mode="invariant", seed=1, meta={}),
            "calls": store.begin_run(task="api:chat", model_id="m", kernel_mode="invariant", seed=1,
                                     meta={"source": "tttr serve"}),
            "program": store.begin_run(task="program:python3", model_id="m", kernel_mode="invariant", seed=1,
                                       meta={"source": "tttr record", "program": ["python3", "a.py"]}),
        }
    return db, ids


def test_each_run_has_one_kind_named_by_its_metadata(tmp_path):
    db, ids = _runs(tmp_path)
    with Store.open(db, readonly=True) as store:
        found = {name: kind_of(store.run(rid)) for name, rid in ids.items()}
    assert found == {"agent": AGENT, "calls": CALLS, "program": PROGRAM}
    assert [k.name for k in KINDS] == ["agent", "calls", "program", "imported"] and len({k.label for k in KINDS}) == 4
    assert AGENT.experiments and PROGRAM.experiments and not CALLS.experiments
    # What the command line and the app ask of a kind instead of its name: whether its verbs run a program
    assert [k.runs_program for k in KINDS] == [False, False, True, True]


def test_a_kind_refuses_what_it_does_not_take_before_anything_is_read_or_written(tmp_path):
    db, ids = _runs(tmp_path)
    before = db.read_bytes()
    with Store.open(db, readonly=True) as store:
        agent, program = store.run(ids["agent"]), store.run(ids["program"])
        with pytest.raises(KindError, match="--code lays a program's files"):
            AGENT.check_replay(store, agent, ReplayRequest(Policy.parse(""), code="somewhere"))
        with pytest.raises(KindError, match="only its faithful replay"):
            PROGRAM.check_replay(store, program, ReplayRequest(Policy.parse("token")))
        with pytest.raises(KindError, match="only its faithful replay"):
            PROGRAM.check_replay(store, program, ReplayRequest(Policy.parse(""), seed=3))
        with pytest.raises(TTTRError, match=f"run {program.id} is incomplete: only complete runs can be replayed"):
            PROGRAM.check_replay(store, program, ReplayRequest(Policy.parse(""), code="d"))  # the recording checked
        assert isinstance(ForkRequest("1:tool", "x"), ForkRequest)
    assert db.read_bytes() == before


def test_the_app_asks_a_runs_kind_through_kind_of_only():
    asked = [str(p.relative_to(ROOT)) for p in (ROOT / "app").rglob("*.py")
             if "is_program_run" in p.read_text() or "is_call_run" in p.read_text()]
    assert not asked, f"these app modules decide a run's kind themselves: {asked}"
    # ... nor branch on which kind it is: they ask the kind (steps, deltas, runs_program, its refusals)
    import re

    which = re.compile(r"\bkind is (not )?(AGENT|CALLS|PROGRAM|IMPORTED)\b|\bkind\.name (==|in)\b|\b(AGENT|PROGRAM) in kinds\b")
    branching = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "app").rglob("*.py")
                 for i, line in enumerate(p.read_text().splitlines(), 1) if which.search(line)]
    assert not branching, f"these app lines branch on a run's kind: {branching}"


def test_an_experiment_takes_two_runs_of_one_kind_that_has_experiments(tmp_path):
    from tttr.engine.kinds import ExperimentRequest, pair_kind

    db, ids = _runs(tmp_path)
    with Store.open(db, readonly=True) as store:
        agent, calls, program = (store.run(ids[k]) for k in ("agent", "calls", "program"))
        assert pair_kind(agent, agent, "triage") is AGENT and pair_kind(program, program, "bisect") is PROGRAM
        with pytest.raises(KindError, match=f"run {program.id} is a recorded program, but run {agent.id} is not"):
            pair_kind(agent, program, "triage")
        with pytest.raises(KindError, match=f"run {calls.id} is a served API's calls: bisect works on"):
            pair_kind(agent, calls, "bisect")
        with pytest.raises(KindError, match=f"run {calls.id} is a served API's calls: triage works on"):
            CALLS.check_experiment(store, str(db), "triage", ExperimentRequest(agent.id, calls.id))


def test_a_kinds_deltas_are_its_compares_and_a_kind_without_deltas_refuses_both(tmp_path):
    """`kind.deltas` is `kind.compare`'s deltas (the one path an experiment's check asks too);
    served calls have none: both refuse in the same line, naming the run."""
    from tttr.engine.kinds import IMPORTED

    db, ids = _runs(tmp_path)
    with Store.open(db, readonly=True) as store:
        for kind in (CALLS, IMPORTED):
            with pytest.raises(KindError) as by_deltas:
                kind.deltas(store, ids["calls"], ids["calls"])
            with pytest.raises(KindError) as by_compare:
                kind.compare(store, ids["calls"], ids["calls"])
            assert str(by_deltas.value) == str(by_compare.value) and f"run {ids['calls']} is" in str(by_compare.value)


def test_an_imported_trace_refuses_an_experiment_in_its_own_words(tmp_path):
    from tttr.engine.kinds import IMPORTED, pair_kind
    from tttr.engine.traces.imported import IMPORTED_BY

    db = tmp_path / "imported.db"
    with Store.open(db, create=True) as store:
        rid = store.begin_run(task="trace:invoke_agent", model_id="m", kernel_mode=None, seed=None,
                              meta={"source": IMPORTED_BY})
    with Store.open(db, readonly=True) as store:
        run = store.run(rid)
        assert kind_of(run) is IMPORTED
        with pytest.raises(TTTRError, match=f"^run {rid} is an imported trace: bisect needs each layer's values") as e:
            pair_kind(run, run, "bisect")
        assert "\n" not in str(e.value) and e.value.exit_code == 2


def test_record_is_the_kinds_and_each_refusal_is_one_line_before_the_file_exists(tmp_path):
    """`tttr record` asks the kind it records (AGENT for --task, PROGRAM for -- PROGRAM) to check
    the request, then to record; served calls and imported traces are recorded elsewhere."""
    from tttr.engine.kinds import IMPORTED, RecordRequest

    db = tmp_path / "never.db"
    for kind, request, said in (
        (AGENT, RecordRequest(task="no-such-task"), "unknown task 'no-such-task'"),
        (PROGRAM, RecordRequest(argv=("python3", "a.py"), in_place=True), "--in-place runs the program in --tree DIR"),
        (CALLS, RecordRequest(task="write-line"), "tttr record does not make a served API's calls"),
        (IMPORTED, RecordRequest(argv=("python3",)), "tttr record does not make an imported trace"),
    ):
        with pytest.raises(TTTRError, match=said) as refused:
            kind.check_record(request)
        assert refused.value.exit_code == 2 and "\n" not in str(refused.value)
    plan = PROGRAM.check_record(RecordRequest(argv=("python3", "a.py"), seed=7))
    assert plan.run_id is None and plan.checked[1] == 7  # the seed given; the clock now, one the sandbox shows
    assert not db.exists()
