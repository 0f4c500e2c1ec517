"""Recorded programs that call the model through OpenAI's Responses API (the Agents SDK):
a replay whose program now asks something else reports the divergence in the program's own
terms (`instructions`, `input[i]`, as the chat call it is compared as), its later calls are
generated live and answered as Responses calls. And any program that hung when recorded is
stopped at the recording's --timeout when replayed, and a program whose model calls were all
refused is not said to have made none."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from tttr.app.commands.program_output import print_result
from tttr.engine.replay.result import ProgramResult
from tttr.engine.program.divergence import (
    call_divergence, in_responses_terms, message_sources, noting_responses, responses_body,
)
from tttr.engine.program.replay import DEFAULT_TIMEOUT_S, NAMES, recorded_timeout
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import cli_json, program_tree, record_program, replay_json

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "assets" / "tasks" / "write-line"
EXAMPLE = "agents_sdk_agent.py"


def test_each_chat_message_is_named_after_the_responses_field_it_comes_from():
    body = {"instructions": "Be brief.", "input": [
        {"type": "reasoning", "summary": []},
        {"role": "user", "content": "List the files."},
        {"type": "function_call", "call_id": "a", "name": "ls", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "pwd", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "x.txt"},
        {"role": "user", "content": [{"type": "input_text", "text": "And now?"}]},
    ]}
    assert message_sources(body) == ["instructions", "input[1]", "input[2]", "input[4]", "input[5]"]
    assert message_sources({"input": "Hi"}) == ["input"]
    assert in_responses_terms("message 0", {"role": "system", "content": "Be short."}, {}, body) == (
        "instructions", "Be short.", "Be brief.")
    live = {"role": "tool", "tool_call_id": "a", "content": "x.txt"}
    assert in_responses_terms("message 3", {}, live, body) == ("input[4] (its chat message 3)", {}, live)
    assert in_responses_terms("message 7", {"role": "user"}, None, body)[0] == \
        "message 7 (which the request no longer sends)"
    assert in_responses_terms("parameter max_tokens", 8, 16, body) == ("parameter max_output_tokens", 8, 16)
    assert in_responses_terms("parameter temperature", 0, 1, body) == ("parameter temperature", 0, 1)


def test_texts_that_part_late_are_reported_from_where_they_part_and_short_ones_as_before():
    task = "Task: write the line `hello world` into a new file named `greeting.txt`.\n"
    a, b = {"role": "user", "content": task + "What is the name?"}, {"role": "user", "content": task + "Which file?"}
    div = call_divergence("call 0 (step 2)", "message 1", a, b, NAMES)
    at = len(task + "Wh")  # where "What" and "Which" part
    assert div.site == f"call 0 (step 2), message 1, its content from character {at}"
    assert "hat is the name?" in div.describe() and "hich file?" in div.describe(), div.describe()
    assert div.to_json()["recorded"] == a and div.to_json()["live"] == b  # the values stay whole
    short = call_divergence("call 0 (step 0)", "message 0", {"content": "Say hi"}, {"content": "Say bye"}, NAMES)
    assert short.site == "call 0 (step 0), message 0" and "'Say bye'" not in short.describe()
    assert '"Say bye"' in short.describe()  # as a chat call's report always read
    text = call_divergence("call 1 (step 3, POST /v1/responses)", "instructions", "x" * 40 + "A", "x" * 40 + "B", NAMES)
    assert text.site.endswith("instructions, from character 40") and "xA'" in text.describe()
    tools = [{"type": "function", "function": {"name": "list_files", "description": "List the files."}}]
    edited = [{"type": "function", "function": {"name": "list_files", "description": "List every file."}}]
    div = call_divergence("call 0 (step 1, POST /v1/responses)", "parameter tools", tools, edited, NAMES)
    assert div.site.startswith("call 0 (step 1, POST /v1/responses), parameter tools, as JSON from character ")
    assert "the files" in div.describe() and "every file" in div.describe(), div.describe()


def test_the_replay_endpoint_hands_the_replayer_each_responses_request_as_sent():
    async def answer(request):
        await request.body()  # the server reads the body, then answers in its thread pool
        return JSONResponse({"asked": await run_in_threadpool(responses_body)})

    app = Starlette(routes=[Route("/v1/responses", answer, methods=["POST"]),
                            Route("/v1/chat/completions", answer, methods=["POST"])])
    with TestClient(noting_responses(app)) as client:
        sent = {"instructions": "Be brief.", "input": "Hi", "stream": True}
        assert client.post("/v1/responses", json=sent).json() == {"asked": sent}
        assert client.post("/v1/chat/completions", json={"messages": []}).json() == {"asked": None}
        assert client.post("/v1/responses", content=b"not json").json() == {"asked": None}


def test_a_replay_waits_as_long_as_the_recording_did():
    from tttr.sessions.records import RunMeta

    class Run:
        meta = RunMeta.of("program:python3", {"timeout_s": 3})

    assert recorded_timeout(Run) == 3.0
    for meta in ({}, {"timeout_s": True}, {"timeout_s": -1}, {"timeout_s": "3"}, None):
        Run.meta = RunMeta.of("program:python3", meta)
        assert recorded_timeout(Run) == DEFAULT_TIMEOUT_S


def _example_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "work"
    tree.mkdir()
    subprocess.run(["sh", str(TASK / "setup.sh")], cwd=tree, check=True)
    shutil.copy(ROOT / "assets" / "examples" / EXAMPLE, tree)
    return tree


@pytest.mark.slow
@needs_sandbox
def test_an_agents_sdk_program_asking_otherwise_is_reported_as_its_instructions_or_input(tmp_path, capsys):
    from tttr.app.cli import main

    tree, db = _example_tree(tmp_path), tmp_path / "agent.db"
    rec = cli_json(capsys, ["record", "--db", str(db), "--tree", str(tree), "--seed", "1", "--json",
                            "--", "python3", EXAMPLE])
    assert rec["exit_code"] == 0 and rec["calls"] == 2, rec["stderr"]
    source = (tree / EXAMPLE).read_text()
    instructions = "Answer with the value asked for, nothing else."
    (tree / EXAMPLE).write_text(source.replace(instructions, "Answer briefly."))
    res = replay_json(capsys, db, rec["run_id"], "--code", str(tree))
    div = res["divergence"]
    assert div["site"] == "call 0 (step 2, POST /v1/responses), instructions", div  # after list_files and a clock read
    assert div["recorded"] == instructions and div["live"] == "Answer briefly."
    # From there the SDK's (streamed) Responses calls are generated live and answered: the program ends as before.
    assert res["calls_generated"] == 2 and res["logits_computed"] > 0 and res["exit_code"] == 0, res
    assert "greeting.txt: 'hello world' (exit 0)" in res["stdout"]

    (tree / EXAMPLE).write_text(source.replace("What is the file name?", "Which file is it?"))
    assert main(["replay", str(rec["run_id"]), "--db", str(db), "--code", str(tree)]) == 0
    said = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("replay diverged at "))
    assert said.startswith("replay diverged at call 0 (step 2, POST /v1/responses), input[0] (its chat message 1), "
                           "its content from character "), said
    assert "What is the file name?" in said and "Which file is it?" in said, said


STREAMS = """\
import asyncio
from agents import Agent, ModelSettings, Runner

agent = Agent(name="a", model="gpt-4.1-mini", instructions="Be brief.",
              model_settings=ModelSettings(temperature=0, max_tokens=64))


async def main():
    run = Runner.run_streamed(agent, "Name a colour.")
    deltas = [e async for e in run.stream_events()
              if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"]
    print("said:", run.final_output, "in pieces:", len(deltas) > 0)

asyncio.run(main())
"""


@pytest.mark.slow
@needs_sandbox
def test_a_streamed_responses_call_after_the_divergence_is_generated_and_streamed(tmp_path, capsys):
    tree, db = program_tree(tmp_path, "t", STREAMS), tmp_path / "s.db"
    rec = record_program(capsys, db, tree)
    assert rec["exit_code"] == 0 and rec["calls"] == 1 and "in pieces: True" in rec["stdout"], rec
    (tree / "prog.py").write_text(STREAMS.replace("Be brief.", "Be very brief."))
    res = replay_json(capsys, db, rec["run_id"], "--code", str(tree))
    assert res["divergence"]["site"] == "call 0 (step 0, POST /v1/responses), instructions", res
    assert res["calls_generated"] == 1 and res["exit_code"] == 0 and "in pieces: True" in res["stdout"], res


HANGS = "import time\nprint('waiting', flush=True)\ntime.sleep(900)\n"


@pytest.mark.slow
@needs_sandbox
def test_a_program_that_hung_is_replayed_under_the_recordings_timeout(tmp_path, capsys):
    db = tmp_path / "s.db"
    rec = record_program(capsys, db, program_tree(tmp_path, "t", HANGS), "--timeout", "2")
    assert rec["exit_code"] == 124 and rec["limit_hit"] == "timeout" and rec["stdout"] == "waiting\n", rec
    res = replay_json(capsys, db, rec["run_id"])  # not the default 600 s
    assert res["identical"] is True and res["exit_code"] == 124, res
    with Store.open(db, readonly=True) as store:
        assert store.run(rec["run_id"]).meta["timeout_s"] == 2.0
        end = next(e.value for e in store.events(res["run_id"], kind="tool") if "program" in e.value)
    assert end["limit_hit"] == "timeout" and "after the 2 s timeout" in json.dumps(end["stderr"]), end


REFUSED = """\
from openai import OpenAI

OpenAI().responses.create(model="gpt-4.1-mini", input="Find the weather.", tools=[{"type": "web_search"}])
"""


@pytest.mark.slow
@needs_sandbox
def test_a_refused_responses_call_is_counted_and_replays_identically(tmp_path, capsys):
    db = tmp_path / "s.db"
    rec = record_program(capsys, db, program_tree(tmp_path, "t", REFUSED))
    assert rec["exit_code"] == 1 and rec["calls"] == 0 and rec["refused_calls"] == 1, rec
    assert "tools[0] of type 'web_search' is not supported" in rec["stderr"]
    with Store.open(db, readonly=True) as store:
        assert store.run(rec["run_id"]).outcome["refused_calls"] == 1  # the recording says so
    res = replay_json(capsys, db, rec["run_id"])
    assert res["identical"] is True and res["exit_code"] == 1, res  # refused again, as recorded


def test_the_record_report_tells_refused_calls_from_none(capsys):
    refused = ProgramResult(1, "complete", None, exit_code=1, calls=0, stdout="", stderr="", refused=2)
    print_result(refused, "s.db", False)
    err = capsys.readouterr().err
    assert "answered 2 of the program's model calls with an error" in err and "no model call" not in err
    print_result(ProgramResult(1, "complete", None, exit_code=0, calls=0, stdout="", stderr=""), "s.db", False)
    assert "the program made no model call" in capsys.readouterr().err
