"""Check once, then act on the checked plan: `tttr replay` and `tttr fork` of an agent run, of
a served-call run and of a recorded program open the database once read-only (the check) and
once for writing (the act), and decode the run once (one `Source`, one `Store.load_run`). A
plan whose run was deleted or replaced between the check and the act is refused in one line,
with nothing written.

The counting wraps `Store.open`, `Store.load_run` and `Source.__init__` around the real ones;
the runs are real: an agent run recorded with the default model in the sandbox, calls made
with the official `openai` client against a real `tttr serve --db`, a program recorded with
`tttr record -- PROGRAM` in the sandbox."""

from __future__ import annotations

import re

import shutil
from collections import Counter

import pytest

from tttr.engine.kinds import CALLS, ForkRequest, ReplayRequest, kind_of
from tttr.engine.replay.policy import Policy
from tttr.engine.replay.result import ReplayError
from tttr.engine.replay.source import Source
from tttr.sessions.errors import StoreError
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """How often the database is opened (read-only, for writing) and the run decoded."""
    counts: Counter = Counter()
    open_, load_run, source_init = Store.open.__func__, Store.load_run, Source.__init__

    def opened(cls, path, create=True, readonly=False):
        counts["read-only opens" if readonly else "write opens"] += 1
        return open_(cls, path, create=create, readonly=readonly)

    def loaded(self, *a, **kw):
        counts["decodes"] += 1
        return load_run(self, *a, **kw)

    def source(self, *a, **kw):
        counts["sources"] += 1
        source_init(self, *a, **kw)

    monkeypatch.setattr(Store, "open", classmethod(opened))
    monkeypatch.setattr(Store, "load_run", loaded)
    monkeypatch.setattr(Source, "__init__", source)
    return counts


ONCE = {"read-only opens": 1, "write opens": 1, "decodes": 1, "sources": 1}


def _cli(counts: Counter, capsys, *argv: str) -> str:
    from tttr.app.cli import main

    counts.clear()
    capsys.readouterr()
    assert main(list(argv)) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def _children(db) -> list[int]:
    with Store.open(db, readonly=True) as store:
        return sorted(r.id for r in store.runs())


# ---------------------------------------------------------------------------- served calls, no model
def _served_run(store, answers=(["Hel", "lo"], ["Bye"])) -> int:
    """Calls in the format `tttr serve --upstream` records (no prompt ids, no logits)."""
    rid = store.begin_run(task="api:chat", model_id="upstream-model", kernel_mode=None, sampling={"temperature": 0.0},
                          seed=5, fingerprint={"served_by": "upstream", "upstream": "http://127.0.0.1:9/v1"},
                          meta={"source": "tttr serve", "endpoint": "chat",
                                "served_by": {"upstream": "http://127.0.0.1:9/v1"}})
    for step, words in enumerate(answers):
        store.append(rid, f"{step}:prompt",
                     {"endpoint": "chat", "request": {"messages": [{"role": "user", "content": "hi"}]},
                      "sampling": {"temperature": 0.0, "seed": 5}})
        for pos, w in enumerate(words):
            store.append(rid, f"{step}:token:{pos}",
                         {"id": 100 + pos, "text": w, "forced": False, "logprob": -0.5, "rng": [5, 0, pos]})
        store.append(rid, f"{step}:message", {"text": "".join(words), "tool_calls": []})
        store.commit_step(rid)
    store.finish_run(rid, "complete", {"calls": len(answers)})
    return rid


def test_a_served_call_replay_opens_the_file_twice_and_decodes_the_run_once(tmp_path, counted, capsys):
    db = tmp_path / "calls.db"
    with Store.open(db) as store:
        rid = _served_run(store)
    out = _cli(counted, capsys, "replay", str(rid), "--db", str(db))
    assert 'call 0: "Hello"' in out and "tokens identical to the recording" in out
    assert dict(counted) == ONCE


def test_a_plan_whose_run_was_deleted_or_replaced_meanwhile_writes_nothing(tmp_path):
    db = tmp_path / "calls.db"
    with Store.open(db) as store:
        rid = _served_run(store)
    with Store.open(db, readonly=True) as reader:
        run = reader.run(rid)
        kind = kind_of(run)
        plan = kind.check_replay(reader, run, ReplayRequest(Policy.parse("")))
    assert kind is CALLS
    with Store.open(db) as store:
        store.delete_run(rid)
    with pytest.raises(StoreError, match=f"no run {rid} in .*; `tttr runs") as gone:
        kind.replay(str(db), plan)
    assert "\n" not in str(gone.value) and _children(db) == []
    # Another run recorded under the same id (SQLite gives the freed largest id out again).
    with Store.open(db) as store:
        assert _served_run(store, answers=(["Hi"],)) == rid
    with pytest.raises(ReplayError, match=f"run {rid} in .* changed after it was checked .*: run the command again"):
        kind.replay(str(db), plan)
    assert _children(db) == [rid]
    with Store.open(db, readonly=True) as reader:  # checked again, the plan acts
        plan = kind.check_replay(reader, reader.run(rid), ReplayRequest(Policy.parse("")))
    res = kind.replay(str(db), plan)
    assert res.identical and res.actions == ["Hi"] and res.parent == rid and _children(db) == [rid, res.run_id]


# ---------------------------------------------------------------------------- real runs, the default model
@pytest.mark.slow
def test_an_agent_replay_and_fork_open_the_file_twice_and_decode_the_run_once(tmp_path, counted, capsys):
    from tttr.engine.replay.runs import record
    from tttr.engine.replay.runtime import Runtime

    db = tmp_path / "agent.db"
    runtime = Runtime(kernel_mode="invariant")
    try:
        with Store.open(db) as store:
            rid = record(store, "write-line", runtime=runtime, seed=1, temperature=0.7).run_id
            last_tool = [e.site for e in store.events(rid) if e.kind == "tool"][-1]
    finally:
        runtime.close()
    shutil.copy(db, tmp_path / "kept.db")  # the run alone, for the deletion below

    out = _cli(counted, capsys, "replay", str(rid), "--db", str(db))
    assert "decisions identical to the recording" in out
    assert dict(counted) == ONCE
    out = _cli(counted, capsys, "fork", str(rid), "--at", last_tool, "--set", "changed", "--db", str(db))
    assert f"(child of {rid})" in out
    assert dict(counted) == ONCE

    kept = tmp_path / "kept.db"
    with Store.open(kept, readonly=True) as reader:
        run = reader.run(rid)
        kind = kind_of(run)
        plan = kind.check_fork(reader, run, ForkRequest(last_tool, "changed"))
    with Store.open(kept) as store:
        store.delete_run(rid)
    with pytest.raises(StoreError, match=f"no run {rid} in "):
        kind.fork(str(kept), plan)
    assert _children(kept) == []


@pytest.mark.slow
def test_a_served_call_fork_opens_the_file_twice_and_decodes_the_run_once(tmp_path, counted, capsys):
    import openai

    from serve_helpers import recording_server

    db = tmp_path / "served.db"
    server = recording_server(db)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        client.chat.completions.create(messages=[{"role": "user", "content": "Name a colour."}], max_tokens=6,
                                       temperature=0.8, seed=11, model=server.service.model_id)
    finally:
        server.stop()
        server.recorder.close()
        server.service.close()
    (rid,) = _children(db)
    out = _cli(counted, capsys, "fork", str(rid), "--at", "0:token:1", "--set", "id:28", "--db", str(db))
    assert f"(child of {rid})" in out and "call 0:" in out
    # Each token's text beside its id, as the fork had them (the recorded event, the tokenizer):
    # nothing is read back to show them.
    assert re.search(r'diverged at 0:token:1 \(token layer\): recorded ".+" \(\d+\), live "," \(28\)', out), out
    assert dict(counted) == ONCE


# ---------------------------------------------------------------------------- a recorded program
ONE_CALL_PROGRAM = """\
from openai import OpenAI
from tttr.recorders import sdk

@sdk.tool
def decide(text):
    return "stop"

client = OpenAI()
model = client.models.list().data[0].id
r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi"}], max_tokens=3, seed=3)
print("verdict:", decide(r.choices[0].message.content))
print("notes:", open("notes.txt").read().strip())
"""


@pytest.mark.slow
@needs_sandbox
def test_a_program_replay_and_fork_open_the_file_twice_and_decode_the_run_once(tmp_path, counted, capsys):
    from tests.program_helpers import program_tree, record_one_call

    from tttr.engine.kinds import PROGRAM

    db = tmp_path / "program.db"
    tree = program_tree(tmp_path, "tree", ONE_CALL_PROGRAM)
    (tree / "notes.txt").write_text("v1\n")
    rid = record_one_call(capsys, db, tree)["run_id"]
    shutil.copy(db, tmp_path / "kept.db")

    out = _cli(counted, capsys, "replay", str(rid), "--db", str(db))
    assert "identical to the recording" in out, out
    assert dict(counted) == ONCE
    # Acted on the checked plan, nothing is generated: the fork's new values, then the recording's.
    for at, value, said in (("1:tool", "go", "verdict: go"), ("setup:file:notes.txt", "v2", "notes: v2"),
                            ("setup:clock", "+1d", "verdict: stop")):
        out = _cli(counted, capsys, "fork", str(rid), "--at", at, "--set", value, "--db", str(db))
        assert said in out and f"forked at {at}, 0 model calls generated" in out, out
        assert dict(counted) == ONCE, at

    kept = tmp_path / "kept.db"
    with Store.open(kept, readonly=True) as reader:
        run = reader.run(rid)
        kind = kind_of(run)
        plans = [kind.check_fork(reader, run, ForkRequest("1:tool", "go")),
                 kind.check_replay(reader, run, ReplayRequest(Policy.parse("")))]
    assert kind is PROGRAM
    with Store.open(kept) as store:
        store.delete_run(rid)
    for plan, act in zip(plans, (kind.fork, kind.replay)):
        with pytest.raises(StoreError, match=f"no run {rid} in "):
            act(str(kept), plan)
    assert _children(kept) == []
