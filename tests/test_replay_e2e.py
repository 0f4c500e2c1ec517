"""Record, replay, fork and diff on the embedded default model, in the real sandbox, into a
real session database."""

import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tttr.engine.replay.diff import diff_runs
from tttr.engine.replay.mutation import MutationError, parse_mutation
from tttr.engine.replay.runs import fork, record, replay
from tttr.engine.replay.runtime import Runtime
from tttr.sessions.store import Store

pytestmark = pytest.mark.slow  # records, replays and forks real runs of the default model

ROOT = Path(__file__).resolve().parent.parent
TASK = "write-line"
SEED = 1


@pytest.fixture(scope="module")
def runtime():
    rt = Runtime(kernel_mode="invariant")
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, runtime):
    db = tmp_path_factory.mktemp("replay") / "session.db"
    store = Store.open(db, create=True)
    res = record(store, TASK, runtime=runtime, seed=SEED, temperature=0.7)
    yield store, res, db
    store.close()


def _events(store, run_id):
    return [(e.seq, e.site, e.kind, e.value) for e in store.events(run_id)]


def test_record_writes_all_three_layers(recorded):
    store, res, _ = recorded
    assert res.status == "complete" and store.run(res.run_id).status == "complete"
    layers = {e.layer for e in store.events(res.run_id)}
    assert {"tensor", "token", "trace", "agent"} <= layers
    assert len(res.actions) >= 1
    first = store.event_at(res.run_id, "0:token:0").value
    assert set(first) >= {"id", "forced", "logprob", "rng"} and first["rng"] == [SEED, 0, 0]
    logits = store.event_at(res.run_id, "0:logits:0").value
    assert len(logits["digest"]) == 32 and len(logits["topk"]) == 5 and logits["mode"] == "invariant"


def test_faithful_replay_is_identical_and_computes_nothing(recorded, runtime):
    store, res, _ = recorded
    child = replay(store, res.run_id, (), runtime=runtime)
    assert child.identical and child.divergence is None
    assert child.logits_computed == 0 and child.commands_run == 0
    assert child.actions == res.actions and child.outcome["passed"] == res.outcome["passed"]
    assert diff_runs(store, res.run_id, child.run_id).identical
    assert store.run(child.run_id).parent == res.run_id


def test_tensor_freed_replay_recomputes_the_same_logits(recorded, runtime):
    store, res, _ = recorded
    child = replay(store, res.run_id, ("tensor",), runtime=runtime)
    assert child.logits_computed > 0
    assert child.identical, child.divergence
    assert diff_runs(store, res.run_id, child.run_id).identical


def _check_fork(store, parent, child, site):
    fork_seq = store.event_at(parent.run_id, site).seq
    p, c = _events(store, parent.run_id), _events(store, child.run_id)
    assert c[:fork_seq] == p[:fork_seq]  # the prefix is the parent's
    mutated = store.event_at(child.run_id, site)
    assert mutated.seq == fork_seq and mutated.value != store.event_at(parent.run_id, site).value
    run = store.run(child.run_id)
    assert run.parent == parent.run_id and run.fork_site == site
    return mutated


def test_fork_a_tool_result(recorded, runtime):
    store, res, _ = recorded
    child = fork(store, res.run_id, "0:tool", "exit=1", runtime=runtime)
    mutated = _check_fork(store, res, child, "0:tool")
    assert mutated.value["exit_code"] == 1 and mutated.value.get("mutated")
    # The next step's context now holds the changed observation, so it ran live.
    if len(res.actions) > 1:
        assert child.logits_computed > 0


def test_fork_a_clock_value(recorded, runtime):
    store, res, _ = recorded
    child = fork(store, res.run_id, "0:clock", "+1d", runtime=runtime)
    mutated = _check_fork(store, res, child, "0:clock")
    assert mutated.value["t"] > store.event_at(res.run_id, "0:clock").value["t"]
    assert child.commands_run >= 1  # the command could not come from the cassette at another time


def test_a_command_asked_again_in_the_same_state_takes_the_answer_the_database_holds(recorded, runtime):
    """The world as a function of its state: a second fork identical to a first runs no
    command (the first fork asked each of them in the same tree, clock, seed and
    environment), and says where each answer came from; the decisions are the same."""
    store, res, _ = recorded
    first = fork(store, res.run_id, "0:clock", "+17d", runtime=runtime)  # no other test asks this day
    assert first.commands_run >= 1
    second = fork(store, res.run_id, "0:clock", "+17d", runtime=runtime)
    assert second.commands_run == 0 and second.actions == first.actions
    tools = {e.site: e.value for e in store.events(second.run_id, kind="tool")}
    reused = {at: v["reused_from"] for at, v in tools.items() if "reused_from" in v}
    assert reused and all(v["off_record"] for at, v in tools.items() if at in reused)
    assert {r["run"] for r in reused.values()} == {first.run_id}, reused
    assert all(store.event_at(r["run"], r["site"]).value["stdout"] == tools[at]["stdout"] for at, r in reused.items())


def test_fork_the_setup_clock_from_the_command_line_in_either_spelling(recorded, capsys):
    """`--at setup:clock` and the old `--at -1:clock` (as its own argument, which argparse
    alone reads as an option) fork the same site; events, diff and the fork's record all
    name it `setup:clock`."""
    from datetime import datetime, timedelta

    from tttr.app.cli import main

    store, res, db = recorded
    was = datetime.fromisoformat(store.event_at(res.run_id, "setup:clock").value["t"])
    assert store.event_at(res.run_id, "-1:clock").seq == store.event_at(res.run_id, "setup:clock").seq == 0
    forks = []
    for at, value in (("setup:clock", "+30d"), ("-1:clock", "-1d")):
        capsys.readouterr()
        assert main(["fork", str(res.run_id), "--at", at, "--set", value, "--db", str(db), "--json"]) == 0, at
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        forks.append(out["run_id"])
        child = store.run(out["run_id"])
        assert (child.parent, child.fork_site, child.mutation["site"]) == (res.run_id, "setup:clock", "setup:clock")
    clocks = [datetime.fromisoformat(store.event_at(r, "setup:clock").value["t"]) - was for r in forks]
    assert clocks == [timedelta(days=30), timedelta(days=-1)]

    assert main(["events", str(db), str(forks[0]), "--limit", "2", "--json"]) == 0
    assert [json.loads(line)["site"] for line in capsys.readouterr().out.splitlines()] == ["setup:clock", "setup:setup"]
    assert main(["events", str(db), str(forks[0]), "--limit", "2"]) == 0
    assert "setup:clock" in capsys.readouterr().out
    assert main(["diff", str(res.run_id), str(forks[0]), "--db", str(db), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["first_divergence"]["trace"]["site"] == "setup:clock" and d["differing_sites"]["trace"] >= 1
    assert main(["diff", str(res.run_id), str(forks[0]), "--db", str(db)]) == 0
    assert "first divergence: setup:clock (trace layer)" in capsys.readouterr().out


def test_fork_a_token_and_diff(recorded, runtime):
    store, res, _ = recorded
    logits = store.event_at(res.run_id, "0:logits:0").value
    chosen = store.event_at(res.run_id, "0:token:0").value["id"]
    alt = next(i for i, _ in logits["topk"] if i != chosen)
    child = fork(store, res.run_id, "0:token:0", str(alt), runtime=runtime)
    mutated = _check_fork(store, res, child, "0:token:0")
    assert mutated.value["id"] == alt and mutated.value["forced"]
    assert child.logits_computed > 0  # the rest of the message was generated live
    d = diff_runs(store, res.run_id, child.run_id)
    assert d.first_divergence["token"].site == "0:token:0"
    assert not d.identical


def test_fork_a_whole_answer(recorded, runtime):
    """`STEP:message` replaces the model's whole answer at a step: its tokens are forced, the
    message ends there, the command it names runs, and the rest runs on from the change."""
    store, res, _ = recorded
    command = "printf 'hello world\\n' > greeting.txt"
    child = fork(store, res.run_id, "0:message", command, runtime=runtime)
    first = store.event_at(res.run_id, "0:token:0").seq
    assert _events(store, child.run_id)[:first] == _events(store, res.run_id)[:first]
    run = store.run(child.run_id)
    assert run.parent == res.run_id and run.fork_site == "0:message"
    tokens = [e.value for e in store.events(child.run_id) if e.kind == "token" and e.step == 0]
    assert tokens and all(t["forced"] and t["mutated"] for t in tokens)
    assert runtime.tokenizer.decode([t["id"] for t in tokens]) == command + "\n```"
    assert child.actions[0] == command
    assert store.event_at(child.run_id, "0:tool").value["cmd"] == command
    assert child.outcome["passed"]  # the task asks for exactly that line
    again = replay(store, child.run_id, (), runtime=runtime)  # a fork replays like any run
    assert again.identical, again.divergence
    # As the app's edit dialog offers it: the message event's text, opening fence and all.
    fenced = fork(store, res.run_id, "0:message", json.dumps("```bash\n" + command + "\n```"), runtime=runtime)
    assert fenced.actions[0] == command
    assert [e.value for e in store.events(fenced.run_id) if e.kind == "token" and e.step == 0] == tokens


def test_fork_a_start_tree_file_and_a_starting_variable(recorded, runtime):
    """`setup:file:PATH` and `setup:env:NAME`: the run starts from another tree or with another
    variable, so its first command meets a world the recording never had and runs live."""
    from tttr.recorders.treestate import tree_at

    store, res, _ = recorded
    child = fork(store, res.run_id, "setup:file:hint.txt", "write hello world", runtime=runtime)
    start = tree_at(store, child.run_id, -1)
    assert "hint.txt" in start.files and "hint.txt" not in tree_at(store, res.run_id, -1).files
    setup = store.event_at(child.run_id, "setup:setup").value
    assert setup["mutated"] == "setup:file:hint.txt" and setup["tree"] == start.digest
    assert store.event_at(child.run_id, "0:tool").value["tree_before"] == start.digest
    assert child.commands_run >= 1
    assert diff_runs(store, res.run_id, child.run_id).first_divergence["trace"].site == "setup:setup"

    env = fork(store, res.run_id, "setup:env:GREETING", "hi there", runtime=runtime)
    assert store.event_at(env.run_id, "0:tool").value["exports"] == {"GREETING": "hi there"}
    assert store.event_at(env.run_id, "setup:setup").value["exports"] == {"GREETING": "hi there"}
    again = replay(store, env.run_id, (), runtime=runtime)  # starts with the variable again: a cassette hit
    assert again.identical and again.commands_run == 0, again.divergence


def test_a_forced_nul_token_gives_a_failed_command_not_an_incomplete_fork(recorded, runtime):
    store, res, _ = recorded
    (nul,) = runtime.tokenizer.encode("\x00")
    child = fork(store, res.run_id, "0:token:0", json.dumps("\x00"), runtime=runtime)
    assert store.event_at(child.run_id, "0:token:0").value["id"] == nul
    assert child.status == "complete" and store.run(child.run_id).status == "complete"
    assert "\x00" in child.actions[0]
    tool = store.event_at(child.run_id, "0:tool").value
    assert tool["exit_code"] == 126 and "NUL byte" in tool["stderr"]


def test_bad_mutations_are_refused(recorded, runtime):
    store, res, _ = recorded
    tk = runtime.tokenizer
    for site, value, reason in [
        ("9:clock", "+1", "does not exist"),
        ("0:clock", "yesterday", "does not parse"),
        ("0:tool", '{"exit_code": "one"}', "must be an integer"),
        ("0:token:0", "999999", "outside the vocabulary"),
        ("0:token:0", "hello world again", "not one"),
        ("0:action", "x", "cannot be edited"),
        ("0:message", "   ", "message text is empty"),
        ("0:message", '"unterminated', "not a valid JSON string"),
        ("0:message", "word " * 5000, "give at most"),
        ("9:message", "ls", "does not exist"),
        ("setup:file:nowhere/a.txt", "x", "no folder 'nowhere'"),
        ("setup:file:../a.txt", "x", "not a path inside the start tree"),
        ("setup:file:/etc/passwd", "x", "not a path inside the start tree"),
        ("setup:env:LD_PRELOAD", "x", "not a variable a run can start with"),
        ("setup:env:1X", "x", "not a variable a run can start with"),
    ]:
        with pytest.raises(MutationError, match=reason):
            parse_mutation(store, res.run_id, site, value, tokenizer=tk)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(recorded, tmp_path):
    store, res, live_db = recorded
    # A settled copy of the session (no write-ahead log pending), so the hash compares the file.
    db = tmp_path / "copy.db"
    src, dst = sqlite3.connect(live_db), sqlite3.connect(db)
    src.backup(dst)
    src.close(), dst.close()
    other = Store.open(db, create=True)
    foreign = other.begin_run(task=TASK, model_id="another-model-0000", kernel_mode="invariant",
                              sampling={"temperature": 0.7, "top_p": 1.0, "top_k": 0}, seed=1,
                              fingerprint={}, meta={})
    other.finish_run(foreign, status="complete", outcome={"passed": False})
    other.close()
    before = _sha(db)
    cases = [
        (["fork", str(res.run_id), "--at", "42:tool", "--set", "x"], "does not exist"),
        (["fork", str(res.run_id), "--at", "0:clock", "--set", "noon-ish"], "does not parse"),
        (["fork", str(res.run_id), "--at", "0:token:0", "--set", "123456"], "outside the vocabulary"),
        (["fork", str(res.run_id), "--at", "0:tool", "--set", '{"exit_code": true}'], "must be an integer"),
        (["replay", str(foreign)], "recorded with model another-model"),
        (["replay", str(res.run_id), "--free", "tensors"], "unknown layer"),
        (["replay", "999"], "999"),
        # beyond the virtual clock's years or the calendar: refused before the fork begins
        (["fork", str(res.run_id), "--at", "0:clock", "--set", "+999999d"], "outside the virtual clock's years"),
        (["fork", str(res.run_id), "--at", "0:clock", "--set", "+99999999d"], "beyond the calendar"),
        (["fork", str(res.run_id), "--at", "99999999999999999999:clock", "--set", "+1h"], "far beyond"),
    ]
    for argv, reason in cases:
        out = subprocess.run([sys.executable, "-m", "tttr.app", *argv, "--db", str(db)], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, (argv, out.stderr)
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and reason in lines[0], (argv, out.stderr)
    assert _sha(db) == before


def test_cli_json_output(recorded):
    store, res, db = recorded
    out = subprocess.run([sys.executable, "-m", "tttr.app", "replay", str(res.run_id), "--db", str(db), "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["identical"] is True and data["divergence"] is None and data["actions"] == res.actions
