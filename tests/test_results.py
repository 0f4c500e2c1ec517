"""One result type for what a run's verbs return (engine/replay/result.py): every kind's record,
replay and fork gives a RunResult, whose shared fields (run_id, parent, status, outcome / passed,
identical, divergence) say what the store says of the new run, whatever the kind; each kind's own
facts are a subclass's fields, and each `--json` keeps its keys in their order."""

from __future__ import annotations

import argparse
import textwrap
from datetime import datetime

import pytest

from tttr.engine.replay.divergence import Divergence
from tttr.engine.replay.result import CallsResult, ProgramResult, ReplayResult, RunResult
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox

# The --json keys of each verb, in order, as tttr printed them before the result types were one
# family: a caller (a script reading the JSON, a test) may rely on them.
AGENT_KEYS = ["run_id", "parent", "status", "outcome", "actions", "steps", "identical", "same_outcome", "divergence",
              "logits_computed", "commands_run"]
PROGRAM_RECORD_KEYS = ["run_id", "exit_code", "calls", "passed", "limit_hit", "refused_calls", "stdout", "stderr"]
PROGRAM_REPLAY_KEYS = ["run_id", "parent", "identical", "sealed", "divergence", "exit_code", "recorded_exit_code",
                       "same_stdout", "same_tree", "calls_answered", "logits_computed", "tools_run", "stdout"]


def _replayed(**kw) -> ReplayResult:
    fields = dict(parent=4, identical=True, exit_code=0, recorded_exit_code=0, stdout="hi\n", same_stdout=True,
                  same_tree=True, calls_answered=2)
    return ReplayResult(9, "complete", {"exit_code": 0, "passed": True}, **{**fields, **kw})


def test_every_kinds_result_is_a_run_result_read_the_same_way():
    divergence = Divergence("1:tool", "trace", "a", "b", ("recorded", "live"))
    results = [
        RunResult(2, "complete", {"passed": False, "checker_exit": 1}, ["ls"], identical=False, parent=1,
                  divergence=divergence),
        CallsResult(3, "complete", {}, ["Hello!", "Bye."], identical=True, parent=1),
        ProgramResult(4, "complete", {"exit_code": 0, "calls": 1, "passed": True}, exit_code=0, calls=1,
                      stdout="", stderr=""),
        _replayed(identical=False, divergence=divergence),
    ]
    for res in results:
        assert isinstance(res, RunResult)
        assert (res.run_id, res.status) == (res.to_json()["run_id"], "complete")
    assert [r.passed for r in results] == [False, None, True, True]  # from the outcome, every kind alike
    assert [r.parent for r in results] == [1, 1, None, 4]
    assert [r.identical for r in results] == [False, True, None, False]
    assert results[0].divergence is results[3].divergence
    # A program's verdict is its outcome's: no check, no verdict.
    unchecked = ProgramResult(5, "complete", {"exit_code": 1, "calls": 0}, exit_code=1, calls=0, stdout="", stderr="")
    assert unchecked.passed is None and unchecked.to_json()["passed"] is None


def test_each_json_keeps_its_keys_in_order():
    assert list(RunResult(1, "complete", None, ["a"]).to_json()) == AGENT_KEYS
    calls = CallsResult(2, "complete", {}, ["x", "y"], extra={"notes": ["n"]})
    assert list(calls.to_json()) == [*AGENT_KEYS, "calls", "notes"] and calls.to_json()["calls"] == 2 == calls.calls
    assert "calls" not in calls.extra  # the type says it is calls, no tag in extra
    program = ProgramResult(3, "complete", {"passed": False}, exit_code=1, calls=2, stdout="o", stderr="e", refused=1,
                            extra={"program_s": 1.5})
    assert list(program.to_json()) == PROGRAM_RECORD_KEYS  # its timings stay out of the JSON, as before
    assert program.to_json()["passed"] is False and program.to_json()["refused_calls"] == 1
    replayed = _replayed(extra={"calls_generated": 0, "fork_site": "1:tool"})
    assert list(replayed.to_json()) == [*PROGRAM_REPLAY_KEYS, "calls_generated", "fork_site"]


def test_the_printer_tells_served_calls_by_their_type(capsys):
    from tttr.app.commands.agent import _print_result

    args = argparse.Namespace(json=False)
    _print_result(args, CallsResult(3, "complete", {}, ["Hello!"], identical=True, parent=1), "replayed")
    out = capsys.readouterr().out
    assert "replayed run 3 (child of 1): 1 calls, status complete" in out and 'call 0: "Hello!"' in out
    assert "tokens identical" in out
    # An agent run whose extra happens to hold "calls" is still an agent run: steps and decisions.
    _print_result(args, RunResult(4, "complete", {"passed": True}, ["ls"], identical=True, parent=1,
                                  extra={"calls": 7}), "replayed")
    out = capsys.readouterr().out
    assert "1 steps, outcome passed" in out and "step 0: ls" in out and "decisions identical" in out


def _same_as_stored(store, res: RunResult) -> None:
    run = store.run(res.run_id)
    assert (res.parent, res.status) == (run.parent, run.status)
    assert res.outcome == run.outcome and res.passed == run.outcome.passed


def test_a_served_call_replay_is_a_calls_result_as_stored(tmp_path):
    from tttr.engine.kinds import CALLS, ReplayRequest, kind_of
    from tttr.engine.replay.policy import Policy
    from test_serve_replay import _proxied_run  # a proxied run replays from its recording alone: no model

    db = tmp_path / "p.db"
    with Store.open(db) as store:
        rid = _proxied_run(store)
    with Store.open(db, readonly=True) as reader:
        run = reader.run(rid)
        assert kind_of(run) is CALLS
        plan = CALLS.check_replay(reader, run, ReplayRequest(Policy.parse(None)))
    res = CALLS.replay(str(db), plan)
    assert type(res) is CallsResult and res.calls == 2 and res.identical
    with Store.open(db, readonly=True) as store:
        _same_as_stored(store, res)


SOURCE = textwrap.dedent("""\
    from openai import OpenAI
    from tttr.recorders import sdk

    @sdk.tool
    def decide(text):
        return "stop"

    client = OpenAI()
    r = client.chat.completions.create(model=client.models.list().data[0].id,
                                       messages=[{"role": "user", "content": "Say hi"}], max_tokens=3, seed=3)
    verdict = decide(r.choices[0].message.content)
    print("verdict:", verdict)
    open("verdict.txt", "w").write(verdict)
""")


@pytest.mark.slow
@needs_sandbox
def test_a_programs_record_replay_and_fork_fill_the_shared_fields(tmp_path):
    from tttr.engine.kinds import PROGRAM, ForkRequest, RecordRequest, ReplayRequest
    from tttr.engine.replay.policy import Policy

    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "prog.py").write_text(SOURCE)
    db = str(tmp_path / "s.db")
    request = RecordRequest(argv=("python3", "prog.py"), tree=str(tree), seed=7, clock=datetime(2026, 3, 2, 10),
                            check="grep -q stop verdict.txt")
    recorded = PROGRAM.record(db, PROGRAM.check_record(request))
    assert type(recorded) is ProgramResult and recorded.exit_code == 0 and recorded.calls == 1, recorded.stderr
    assert recorded.passed is True and recorded.parent is None and recorded.identical is None
    with Store.open(db, readonly=True) as reader:
        run = reader.run(recorded.run_id)
        replay_plan = PROGRAM.check_replay(reader, run, ReplayRequest(Policy.parse(None)))
        fork_plan = PROGRAM.check_fork(reader, run, ForkRequest("1:tool", "again"))
    replayed = PROGRAM.replay(db, replay_plan)
    forked = PROGRAM.fork(db, fork_plan)
    assert type(replayed) is type(forked) is ReplayResult
    assert replayed.identical and replayed.divergence is None and replayed.passed is True
    assert forked.passed is False and forked.same_tree is False  # the check, run again on the fork's end tree
    with Store.open(db, readonly=True) as store:
        for res in (recorded, replayed, forked):
            _same_as_stored(store, res)
        assert replayed.parent == forked.parent == recorded.run_id
