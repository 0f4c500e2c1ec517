"""A user's program replayed and forked against an imported trace (`tttr replay IMPORTED --
PROGRAM`, `tttr fork IMPORTED --at SITE --set VALUE -- PROGRAM`): the comparisons alone, bad
input refused in one line with nothing written, and end to end with a real program in the real
sandbox: the OpenAI example recorded, exported and imported (its replay must match), and a
hand-written OTLP trace whose answers the program's requests part from (divergence, fork,
sealed, live calls on the real model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from program_helpers import CLOCK, cli_json, program_tree
from test_traces import _file, _run, _span
from tttr.engine.traces.matching import message_difference, tool_difference
from tttr.sessions.store import Store

ROOT = Path(__file__).resolve().parent.parent
QUESTION = "What is in stock?"

# A program on the official openai client and the SDK: a question, a tool, a question with its result.
SHOP = '''
from openai import OpenAI
from tttr.recorders import sdk

@sdk.tool
def stock(item):
    return "0 apples"  # the real tool: a trace's answer stands in for it while the program matches

client = OpenAI()
q = [{"role": "user", "content": "What is in stock?"}]
first = client.chat.completions.create(model="gpt-4o-mini", messages=q, max_tokens=8, temperature=0)
said = first.choices[0].message.content
print("model:", said)
found = stock(item="apple")
print("stock:", found)
q += [{"role": "assistant", "content": said}, {"role": "user", "content": f"stock: {found}"}]
second = client.chat.completions.create(model="gpt-4o-mini", messages=q, max_tokens=8, temperature=0)
print("answer:", second.choices[0].message.content)
'''


def _parts(role: str, text: str) -> dict:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def _chat(sid: str, start: int, messages: list, answer: str, **more) -> dict:
    return _span(sid, "chat gpt-4o-mini", start, {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.input.messages": json.dumps(messages), "gen_ai.output.messages": json.dumps([_parts("assistant", answer)]),
        **more})


def _shop_trace(tmp_path: Path, *, content: bool = True, question: str = QUESTION, name: str = "shop.json") -> Path:
    """A production trace of the shop agent, written by hand as an OTLP exporter writes it."""
    said = "Let me check."
    first = [_parts("user", question)]
    second = first + [_parts("assistant", said), _parts("user", "stock: 3 apples")]
    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "stock"}
    if content:
        tool |= {"gen_ai.tool.call.arguments": json.dumps({"item": "apple"}), "gen_ai.tool.call.result": "3 apples"}
    spans = [_span("a" * 16, "invoke_agent shop", 500, {"gen_ai.operation.name": "invoke_agent"}, parent=None),
             _chat("b" * 16, 1_000, first if content else [], said),
             _span("c" * 16, "execute_tool stock", 2_000, tool),
             _chat("d" * 16, 3_000, second, "Three apples.")]
    if not content:
        spans[1]["attributes"] = [a for a in spans[1]["attributes"] if a["key"] != "gen_ai.input.messages"]
    return _file(tmp_path, spans, name)


def _import(capsys, path: Path, db: Path) -> int:
    code, out, err = _run(capsys, ["import", str(path), "--db", str(db), "--json"])
    assert code == 0, err
    return json.loads(out.strip().splitlines()[-1])["runs"][0]["run"]


# ---------------------------------------------------------------------------- the comparisons
def test_messages_are_compared_by_role_text_and_tool_calls_only():
    trace = [{"role": "user", "content": "hi"},
             {"role": "assistant", "content": "", "tool_calls": [
                 {"id": "call_1", "type": "function", "function": {"name": "stock", "arguments": '{"item": "apple"}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "3 apples"}]
    asked = [{"role": "user", "content": [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]},
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "call_9", "type": "function", "function": {"name": "stock", "arguments": '{"item":"apple"}'}}]},
             {"role": "tool", "tool_call_id": "call_9", "content": "3 apples", "name": "stock"}]
    assert message_difference(trace, asked) is None  # text parts joined, JSON spacing and ids not compared
    asked[2]["content"] = "5 pears"
    assert message_difference(trace, asked) == ("messages[2].content", "3 apples", "5 pears")
    assert message_difference(trace, asked[:2])[0] == "messages[2]"


def test_tool_calls_match_by_name_then_arguments_in_the_trace_s_form():
    foreign = {"function": "stock", "args": [], "kwargs": {"item": "apple", "n": 2}, "result": "3"}
    assert tool_difference(foreign, {"function": "stock", "args": [], "kwargs": {"item": "apple", "n": 2}}) is None
    assert tool_difference(foreign, {"function": "stock", "args": ["apple"], "kwargs": {"n": 2}}) is None  # in order
    assert tool_difference(foreign, {"function": "stock", "args": ["pear"], "kwargs": {"n": 2}}) == \
        ("args", ["apple"], ["pear"])
    assert tool_difference(foreign, {"function": "price", "args": [], "kwargs": {}}) == ("function", "stock", "price")
    exported = {"function": "f", "args": [1], "kwargs": {}, "result": 2}  # tttr's {args, kwargs}: exactly
    assert tool_difference(exported, {"function": "f", "args": [1], "kwargs": {}}) is None
    assert tool_difference(exported, {"function": "f", "args": [], "kwargs": {"x": 1}})[0] == "args"
    shell = {"cmd": "ls", "stdout": "a\n", "exit_code": 0}
    assert tool_difference(shell, {"cmd": "ls", "cwd": "/work", "timeout_s": 60}) is None
    assert tool_difference(shell, {"cmd": "ls -a", "cwd": "/work", "timeout_s": 60}) == ("cmd", "ls", "ls -a")


# ---------------------------------------------------------------------------- bad input
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    db = tmp_path / "i.db"
    run = _import(capsys, _shop_trace(tmp_path), db)
    bare = _import(capsys, _shop_trace(tmp_path, content=False, name="bare.json"), db)
    code_dir = program_tree(tmp_path, "code", SHOP)
    before = db.read_bytes()
    cases = [
        (["replay", str(run)], "holds no program"),  # no -- PROGRAM
        (["fork", str(run), "--at", "1:tool", "--set", "x"], "holds no program"),
        (["replay", str(run), "--", "python3", "prog.py"], "--code DIR"),  # the program's file is nowhere
        (["replay", str(run), "--code", str(tmp_path / "nowhere"), "--", "python3", "prog.py"], "not a directory"),
        (["replay", str(run), "--code", str(code_dir), "--", "python3", "other.py"], "holds no other.py"),
        (["replay", str(bare), "--code", str(code_dir), "--", "python3", "prog.py"], "has no input messages"),
        (["fork", str(run), "--at", "7:tool", "--set", "x", "--code", str(code_dir), "--", "python3", "prog.py"],
         "no tool call at 7:tool"),
        (["fork", str(run), "--at", "1:message", "--set", "x", "--code", str(code_dir), "--", "python3", "prog.py"],
         "no model call at 1:message"),
        (["fork", str(run), "--at", "0:clock", "--set", "+1", "--code", str(code_dir), "--", "python3", "prog.py"],
         "STEP:message"),
        (["replay", str(run), "--free", "token", "--code", str(code_dir), "--", "python3", "prog.py"], "drop --free"),
        (["replay", str(run), "--upstream", "ftp://x", "--code", str(code_dir), "--", "python3", "prog.py"],
         "not an http(s) URL"),
        (["replay", str(run), "--upstream", "http://127.0.0.1:9/v1", "--upstream-key-env", "TTTR_NO_SUCH_KEY_VAR",
          "--code", str(code_dir), "--", "python3", "prog.py"], "TTTR_NO_SUCH_KEY_VAR"),
        (["replay", str(run), "--upstream", "http://127.0.0.1:9/v1", "--sealed", "--code", str(code_dir), "--",
          "python3", "prog.py"], "drop one"),
        (["fork", str(run), "--at", "0:message", "--set", '{"text": 5}', "--code", str(code_dir), "--", "python3",
          "prog.py"], "a model answer's JSON is"),
    ]
    for argv, says in cases:
        code, out, err = _run(capsys, [*argv[:2], "--db", str(db), *argv[2:]] if "--" not in argv else
                              [*argv[:argv.index("--")], "--db", str(db), *argv[argv.index("--"):]])
        assert code == 2 and out == "" and err.count("\n") == 1 and says in err, (argv, err)
    assert db.read_bytes() == before


def test_a_damaged_trace_value_is_one_line_and_nothing_written(tmp_path, capsys):
    """Database contents are untrusted: a tool call whose arguments are of the wrong shape."""
    db = tmp_path / "d.db"
    with Store.open(db) as store:
        run = store.begin_run(task="trace:x", meta={"source": "tttr import"})
        store.append(run, "0:message", {"text": "hi", "tool_calls": [], "input": [{"role": "user", "content": "q"}]})
        store.commit_step(run)
        store.append(run, "1:tool", {"function": "stock", "args": [], "kwargs": ["not", "an", "object"], "result": 1})
        store.commit_step(run)
        store.finish_run(run, status="complete")
    code_dir = program_tree(tmp_path, "code", SHOP)
    before = db.read_bytes()
    code, out, err = _run(capsys, ["replay", str(run), "--db", str(db), "--code", str(code_dir), "--", "python3",
                                   "prog.py"])
    assert code == 2 and out == "" and err.count("\n") == 1 and "site 1:tool" in err and "kwargs" in err, err
    assert db.read_bytes() == before


def test_a_program_and_upstream_are_refused_for_a_run_that_is_no_imported_trace(tmp_path, capsys):
    db = tmp_path / "p.db"
    with Store.open(db) as store:
        run = store.begin_run(task="program:python3", meta={"source": "tttr record"})
        store.finish_run(run, status="complete")
    before = db.read_bytes()
    for argv, says in ((["fork", str(run), "--at", "0:tool", "--set", "x", "--db", str(db), "--", "python3", "a.py"],
                        "-- PROGRAM forks your program against an imported trace"),
                       (["replay", str(run), "--db", str(db), "--upstream", "http://127.0.0.1:9/v1"], "drop --upstream")):
        code, out, err = _run(capsys, argv)
        assert code == 2 and out == "" and err.count("\n") == 1 and says in err, (argv, err)
    assert db.read_bytes() == before


# ---------------------------------------------------------------------------- end to end
@pytest.mark.slow
@pytest.mark.parametrize("example", ["openai_agent.py", "anthropic_agent.py", "agents_sdk_agent.py"])
def test_a_recorded_program_exported_and_imported_replays_identically(tmp_path, capsys, example):
    """An example recorded (OpenAI chat completions, Anthropic Messages, the Agents SDK on the
    Responses API), exported with content, imported into another database: the same program
    replayed against the trace is answered call by call and tool by tool."""
    src = tmp_path / "s.db"
    tree = program_tree(tmp_path, "work", (ROOT / "assets" / "examples" / example).read_text())
    rec = cli_json(capsys, ["record", "--db", str(src), "--tree", str(tree), "--seed", "7", "--clock", CLOCK,
                            "--json", "--", "python3", "prog.py"])
    assert rec["exit_code"] == 0 and rec["calls"] == 2, rec
    assert _run(capsys, ["export", str(rec["run_id"]), "--db", str(src), "--otlp", str(tmp_path / "t.json"),
                         "--content"])[0] == 0
    db = tmp_path / "imported.db"
    imported = _import(capsys, tmp_path / "t.json", db)
    res = cli_json(capsys, ["replay", str(imported), "--db", str(db), "--code", str(tree), "--json",
                            "--", "python3", "prog.py"])
    assert res["identical"] is True and res["divergence"] is None, res
    # two model calls and three SDK tools (list_files, write_file, sdk.shell): all from the trace, none run
    assert res["calls_answered"] == 5 and res["tools_run"] == 0 and res["calls_generated"] == 0 and res["logits_computed"] == 0
    assert res["exit_code"] == 0 and res["same_stdout"] is True and res["stdout"] == rec["stdout"]
    with Store.open(db, create=False, readonly=True) as store:
        child = store.run(res["run_id"])
        assert child.parent == imported and child.task == "program:python3"
        assert child.meta["source"] == "tttr record" and child.meta["against"]["trace"] == imported
        kinds = [e.kind for e in store.load_run(child.id)[1] if e.step >= 0]
    assert kinds.count("prompt") == 2 and kinds.count("tool") == 4  # three tools, then the program's end
    again = cli_json(capsys, ["replay", str(res["run_id"]), "--db", str(db), "--json"])  # a recorded program now
    assert again["identical"] is True and again["calls_answered"] >= 5, again


@pytest.mark.slow
def test_a_hand_written_trace_answers_forks_and_diverges_on_the_real_model(tmp_path, capsys):
    db = tmp_path / "i.db"
    run = _import(capsys, _shop_trace(tmp_path), db)
    code = program_tree(tmp_path, "code", SHOP)
    prog = ["--code", str(code), "--json", "--", "python3", "prog.py"]

    res = cli_json(capsys, ["replay", str(run), "--db", str(db), *prog])
    assert res["identical"] is True and res["calls_answered"] == 3 and res["logits_computed"] == 0, res
    assert res["stdout"].splitlines() == ["model: Let me check.", "stock: 3 apples", "answer: Three apples."]

    # The tool's result changed: the next request carries it, parts from the trace, and runs live here.
    fork = cli_json(capsys, ["fork", str(run), "--db", str(db), "--at", "1:tool", "--set", '"5 pears"', *prog])
    assert fork["identical"] is False and fork["forked"] is True and fork["fork_site"] == "1:tool", fork
    d = fork["divergence"]
    assert d["call"] == 1 and d["field"] == {"path": "messages[2].content", "recorded": "stock: 3 apples",
                                             "requested": "stock: 5 pears"}
    assert fork["calls_generated"] == 1 and fork["logits_computed"] > 0
    assert "stock: 5 pears" in fork["stdout"] and "answer: Three apples." not in fork["stdout"]
    with Store.open(db, create=False, readonly=True) as store:
        child = store.run(fork["run_id"])
        assert child.parent == run and child.fork_site == "1:tool" and child.mutation["value"] == {"result": "5 pears"}

    # The model's first answer changed: the program prints it, and its next request parts from the trace.
    fork = cli_json(capsys, ["fork", str(run), "--db", str(db), "--at", "0:message", "--set", "Out of stock.", *prog])
    assert fork["stdout"].splitlines()[0] == "model: Out of stock." and fork["divergence"]["call"] == 1, fork

    # A trace of another question, sealed: the first call parts from it, and nothing runs live (exit 1).
    other = _import(capsys, _shop_trace(tmp_path, question="What is on sale?", name="sale.json"), db)
    status, out, _ = _run(capsys, ["replay", str(other), "--db", str(db), "--code", str(code), "--sealed", "--json",
                                   "--", "python3", "prog.py"])
    sealed = json.loads(out.strip().splitlines()[-1])
    assert status == 1 and sealed["sealed"] is True and sealed["calls_generated"] == 0, sealed
    assert sealed["divergence"]["field"] == {"path": "messages[0].content", "recorded": "What is on sale?",
                                             "requested": QUESTION}
    assert sealed["exit_code"] != 0 and sealed["logits_computed"] == 0  # the program got an error for its call

    # The program's own tool, not the SDK's: the trace's tool call is passed over, and its result is
    # compared where it shows, in the next request (the real tool said "0 apples").
    own = program_tree(tmp_path, "own", SHOP.replace("@sdk.tool\n", ""))
    status, out, _ = _run(capsys, ["replay", str(run), "--db", str(db), "--code", str(own), "--sealed", "--json",
                                   "--", "python3", "prog.py"])
    passed = json.loads(out.strip().splitlines()[-1])
    assert status == 1 and passed["tools_not_asked"] == ["1:tool"] and passed["calls_answered"] == 1, passed
    assert passed["divergence"]["field"] == {"path": "messages[2].content", "recorded": "stock: 3 apples",
                                             "requested": "stock: 0 apples"}


@pytest.mark.slow
def test_live_calls_after_the_divergence_go_upstream(tmp_path, capsys):
    """A fork of the hand-written trace whose next call runs live on `--upstream`: a real `tttr
    serve` (recording its calls) here, as a team's vLLM or hosted model would be."""
    from serve_helpers import recording_server

    db = tmp_path / "i.db"
    run = _import(capsys, _shop_trace(tmp_path), db)
    code = program_tree(tmp_path, "code", SHOP)
    upstream = recording_server(tmp_path / "upstream.db", any_model=True)  # it serves the name the program asks for
    try:
        fork = cli_json(capsys, ["fork", str(run), "--db", str(db), "--at", "1:tool", "--set", '"5 pears"',
                                 "--upstream", upstream.url + "/v1", "--code", str(code), "--json",
                                 "--", "python3", "prog.py"])
        upstream.recorder.flush()
    finally:
        upstream.stop()
    assert fork["divergence"]["call"] == 1 and fork["calls_generated"] == 1 and fork["logits_computed"] == 0, fork
    assert fork["stdout"].splitlines()[1] == "stock: 5 pears" and fork["stdout"].splitlines()[2].startswith("answer: ")
    with Store.open(db, create=False, readonly=True) as store:
        events = store.load_run(fork["run_id"])[1]
        live = [e.value for e in events if e.kind == "message" and "upstream" in e.value]
        assert len(live) == 1 and live[0]["upstream"] == upstream.url + "/v1"
        assert fork["stdout"].splitlines()[2] == f"answer: {live[0]['text']}"
    with Store.open(tmp_path / "upstream.db", create=False, readonly=True) as store:
        asked = [e.value["request"] for r in store.runs() for e in store.load_run(r.id)[1] if e.kind == "prompt"]
    assert len(asked) == 1 and asked[0]["messages"][2]["content"] == "stock: 5 pears"  # the call it served
