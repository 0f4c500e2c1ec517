"""`tttr fork RUN --at SITE --set VALUE` of a recorded program: re-run like a faithful replay,
the new value at the site (an SDK tool's result, or a model call's token with the rest of the
call generated live), answered from the recording while requests match, live after."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tttr.app.cli import main
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import cli_json, program_tree, record_one_call

PROGRAM = textwrap.dedent("""\
    from openai import OpenAI
    from tttr.recorders import sdk

    @sdk.tool
    def decide(text):
        return "stop"

    client = OpenAI()
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi"}],
                                       max_tokens=4, seed=3)
    answer = r.choices[0].message.content
    verdict = decide(answer)
    print("answer:", repr(answer))
    print("verdict:", verdict)
    if verdict == "again":
        r2 = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say more"}],
                                            max_tokens=4, seed=3)
        print("second:", repr(r2.choices[0].message.content))
""")


def _record(capsys, tmp_path: Path, program: str = PROGRAM) -> tuple[Path, dict]:
    db = tmp_path / "s.db"
    return db, record_one_call(capsys, db, program_tree(tmp_path, "tree", program))


def _fork(capsys, db: Path, run_id: int, at: str, value: str) -> dict:
    return cli_json(capsys, ["fork", str(run_id), "--db", str(db), "--at", at, "--set", value, "--json"])


def _tokens(store, run_id: int, step: int) -> list[int]:
    _, events = store.load_run(run_id)
    return [e.value["id"] for e in sorted((e for e in events if e.step == step and e.kind == "token"),
                                          key=lambda e: e.site)]


@pytest.mark.slow
@needs_sandbox
def test_fork_at_an_sdk_tool_result_changes_the_path(tmp_path, capsys):
    db, rec = _record(capsys, tmp_path)
    assert "verdict: stop" in rec["stdout"] and "second:" not in rec["stdout"]
    res = _fork(capsys, db, rec["run_id"], "1:tool", "again")
    assert res["exit_code"] == 0 and res["forked"] is True, res
    assert "verdict: again" in res["stdout"] and "second:" in res["stdout"], res["stdout"]
    assert res["calls_generated"] == 1 and res["logits_computed"] > 0
    assert res["tools_run"] == 0  # the tool was given the new value, not run
    div = res["divergence"]  # the first request after the fork the recording lacks: the second call
    assert div["site"] == "step 2" and "ends here" in div["recorded"] and "Say more" in div["live"], div
    assert res["same_stdout"] is False and res["identical"] is False
    with Store.open(db, readonly=True) as store:
        run, events = store.load_run(res["run_id"])
        assert run.parent == rec["run_id"] and run.fork_site == "1:tool" and run.status == "complete"
        assert run.mutation["value"] == {"result": "again"}
        tool = next(e.value for e in events if e.step == 1 and e.kind == "tool")
        assert tool["result"] == "again"
        assert any(e.step == 2 and e.kind == "prompt" for e in events)  # the second call, recorded live
        assert _tokens(store, res["run_id"], 0) == _tokens(store, rec["run_id"], 0)  # answered from the recording
    capsys.readouterr()
    assert main(["fork", str(rec["run_id"]), "--db", str(db), "--at", "1:tool", "--set", "stop"]) == 0
    out = capsys.readouterr().out  # a value the program does the same with: said so, not a bare "identical"
    assert "forked at 1:tool, 0 model calls generated" in out
    assert "identical to the recording: the program did the same with the new value" in out, out
    # An error as text (what the app's edit dialog suggests) is the SDK's {"type", "message"}.
    res = _fork(capsys, db, rec["run_id"], "1:tool", '{"error": "disk offline"}')
    assert res["exit_code"] == 1 and res["forked"] is True, res  # the program raised sdk.RecordedError
    with Store.open(db, readonly=True) as store:
        tool = next(e.value for e in store.load_run(res["run_id"])[1] if e.step == 1 and e.kind == "tool")
    assert tool["error"] == {"type": "Exception", "message": "disk offline"} and "result" not in tool, tool
    assert main(["diff", str(rec["run_id"]), str(res["run_id"]), "--db", str(db)]) == 0
    capsys.readouterr()
    assert main(["fork", str(rec["run_id"]), "--db", str(db), "--at", "1:tool", "--set", '{"error": 5}']) == 2
    assert "not 5" in capsys.readouterr().err


@pytest.mark.slow
@needs_sandbox
def test_fork_at_a_token_regenerates_the_call_from_there_and_bad_sites_are_refused(tmp_path, capsys):
    db, rec = _record(capsys, tmp_path)
    with Store.open(db, readonly=True) as store:
        recorded = _tokens(store, rec["run_id"], 0)
        runs = len(store.runs())
    assert len(recorded) >= 2
    new = 0 if recorded[1] != 0 else 1
    for at, value in (("1:token:0", "5"), ("9:tool", "x"), ("9:clock", "+1"), ("nonsense", "1"),
                      ("0:token:99", "5"), ("1:tool", "exit=3")):
        assert main(["fork", str(rec["run_id"]), "--db", str(db), "--at", at, "--set", value]) == 2, at
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
    with Store.open(db, readonly=True) as store:
        assert len(store.runs()) == runs  # nothing written
    res = _fork(capsys, db, rec["run_id"], "0:token:1", str(new))
    assert res["exit_code"] == 0 and res["forked"] is True and res["calls_generated"] == 1, res
    with Store.open(db, readonly=True) as store:
        run = store.run(res["run_id"])
        assert run.parent == rec["run_id"] and run.fork_site == "0:token:1"
        tokens = _tokens(store, res["run_id"], 0)
    assert tokens[0] == recorded[0] and tokens[1] == new and tokens != recorded
    assert "answer:" in res["stdout"]
    # The whole answer of call 0 replaced: the program reads exactly that text.
    res = _fork(capsys, db, rec["run_id"], "0:message", "Bonjour à tous")
    assert res["exit_code"] == 0 and res["forked"] is True, res
    assert "answer: 'Bonjour à tous'" in res["stdout"], res["stdout"]
    with Store.open(db, readonly=True) as store:
        run, events = store.load_run(res["run_id"])
        assert run.fork_site == "0:message"
        assert next(e.value for e in events if e.site == "0:message")["text"] == "Bonjour à tous"
        assert all(e.value["forced"] for e in events if e.step == 0 and e.kind == "token")


CLOCK_PROGRAM = textwrap.dedent("""\
    from datetime import datetime
    from openai import OpenAI
    from tttr.recorders import sdk

    client = OpenAI()
    model = client.models.list().data[0].id
    first = sdk.now()
    print("first:", first.isoformat())
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=2, seed=3)
    later = sdk.now()
    print("later:", later.isoformat())
    print("apart:", (later - first).total_seconds())
    print("today:", datetime.now().date().isoformat())
""")


def _lines(stdout: str) -> dict:
    return dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)


@pytest.mark.slow
@needs_sandbox
def test_fork_at_a_clock_read_moves_it_and_later_reads_and_the_setup_clock_moves_the_run(tmp_path, capsys):
    from datetime import datetime, timedelta

    db, rec = _record(capsys, tmp_path, CLOCK_PROGRAM)
    run = rec["run_id"]
    was = _lines(rec["stdout"])
    assert was["today"] == "2026-03-02"
    with Store.open(db, readonly=True) as store:
        _, events = store.load_run(run)
        clocks = [e.site for e in events if e.kind == "clock" and e.value.get("source") != "program"]
    assert clocks == ["setup:clock", "0:clock", "2:clock"], clocks  # the model call between them is step 1

    # One read moved: it and the later read move by the same hour; nothing is generated.
    res = _fork(capsys, db, run, "0:clock", "+1h")
    now = _lines(res["stdout"])
    hour = timedelta(hours=1)
    assert datetime.fromisoformat(now["first"]) == datetime.fromisoformat(was["first"]) + hour
    assert datetime.fromisoformat(now["later"]) == datetime.fromisoformat(was["later"]) + hour
    assert now["apart"] == was["apart"] and now["today"] == was["today"]  # the program's own clock is not moved
    assert res["forked"] is True and res["calls_generated"] == 0 and res["logits_computed"] == 0, res
    with Store.open(db, readonly=True) as store:
        child, events = store.load_run(res["run_id"])
        assert child.parent == run and child.fork_site == "0:clock" and child.status == "complete"
        assert [e.value["t"][:19] for e in events if e.kind == "clock" and e.step >= 0
                and e.value.get("source") != "program"] == [now["first"], now["later"]]

    # The setup clock moved: the whole run happens on another day, the program's own clock included.
    res = _fork(capsys, db, run, "setup:clock", "2026-05-01T08:00:00")
    now = _lines(res["stdout"])
    moved = datetime(2026, 5, 1, 8) - datetime(2026, 3, 2, 10)
    assert now["today"] == "2026-05-01"
    assert datetime.fromisoformat(now["first"]) == datetime.fromisoformat(was["first"]) + moved
    assert datetime.fromisoformat(now["later"]) == datetime.fromisoformat(was["later"]) + moved
    assert res["calls_generated"] == 0, res  # the prompt does not hold the time: still the recorded call
    with Store.open(db, readonly=True) as store:
        child, events = store.load_run(res["run_id"])
        setup = next(e.value for e in events if e.kind == "setup")
        assert setup["clock"] == "2026-05-01T08:00:00" and child.parent == run
        assert events[0].site == "setup:clock" and events[0].value == {"t": "2026-05-01T08:00:00"}

    # Bad values and sites: one line, exit 2, nothing written.
    with Store.open(db, readonly=True) as store:
        runs = len(store.runs())
    for at, value in (("0:clock", "tomorrow"), ("3:clock", "+1"), ("setup:clock", "+900000d")):
        assert main(["fork", str(run), "--db", str(db), "--at", at, "--set", value]) == 2, at
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1, err
    with Store.open(db, readonly=True) as store:
        assert len(store.runs()) == runs


@pytest.mark.slow
@needs_sandbox
def test_a_fork_cancelled_while_its_program_runs_is_stored_incomplete_without_a_verdict(tmp_path, capsys):
    import threading

    from tttr.engine.program.fork import check_program_fork
    from tttr.engine.program.replay import replay_program

    db, rec = _record(capsys, tmp_path)
    with Store.open(db, readonly=True) as store:
        plan = check_program_fork(store, rec["run_id"], "1:tool", "again")
    plan.cancel = threading.Event()
    plan.cancel.set()  # an experiment's Ctrl-C before the program asked anything: every model call is refused
    res = replay_program(str(db), rec["run_id"], fork=plan)
    assert res.exit_code != 0  # the openai client raised on the refused call
    with Store.open(db, readonly=True) as store:
        run = store.run(res.run_id)
        assert run.status == "incomplete" and "cancelled" in run.outcome["reason"], run.outcome
        assert "passed" not in run.outcome  # no check ran on a cut program's tree
