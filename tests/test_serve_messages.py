"""`POST /v1/messages`: Anthropic's Messages API over the chat machinery. The translation both
ways and the stream's events are checked with the official `anthropic` client against a real
server whose answers come from a recording (no model); the tests marked slow run the default
model: a server with --db, and the example agent recorded, replayed and forked in the sandbox."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tttr.engine.serve.errors import APIError
from tttr.engine.serve.messages_api import to_chat, to_message
from sandbox_helpers import needs_sandbox
from serve_helpers import Running, recording_server
from tests.program_helpers import cli_json, replay_json

ROOT = Path(__file__).resolve().parent.parent
CHAT = {"id": "chatcmpl-abc123", "object": "chat.completion", "created": 1767225600, "model": "smol",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop",
                     "logprobs": None}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}, "tttr": {"seed": 4}}
CALLED = {**CHAT, "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
    "role": "assistant", "content": "Looking.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]}}]}
STOPPED = {**CHAT, "choices": [{**CHAT["choices"][0], "message": {"role": "assistant", "content": "Par"}}],
           "tttr": {"seed": 4, "stop_sequence": "is."}}
TOOL = {"name": "weather", "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                                 {"type": "text", "text": "And tomorrow?"}]},
]


def _refused(body, param: str | None, words: str) -> None:
    with pytest.raises(APIError) as info:
        to_chat(body)
    assert info.value.status == 400 and info.value.param == param and words in info.value.message, info.value.to_json()


# ---------------------------------------------------------------------------- no model
def test_a_conversation_with_tools_becomes_the_chat_call_it_means():
    chat = to_chat({"model": "claude-haiku-4-5", "max_tokens": 20, "system": [{"type": "text", "text": "Be brief."}],
                    "messages": CONVERSATION, "tools": [TOOL], "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
                    "stop_sequences": ["\n\n"], "temperature": 0.5, "top_p": 0.9, "top_k": 40, "metadata": {"user_id": "u"},
                    "stream": True, "thinking": {"type": "disabled"}})
    assert chat == {
        "model": "claude-haiku-4-5", "max_tokens": 20, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Let me look.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
            {"role": "user", "content": "And tomorrow?"}],
        "tools": [{"type": "function", "function": {"name": "weather", "parameters": TOOL["input_schema"],
                                                    "description": "The weather in a city."}}],
        "tool_choice": "auto", "parallel_tool_calls": False,
        "stop": ["\n\n"],
        "stream": True, "stream_options": {"include_usage": True}}
    counted = to_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, counting=True)
    assert counted == {"model": "m", "messages": [{"role": "user", "content": "hi"}]}  # no max_tokens needed


def test_what_has_no_chat_counterpart_is_refused_naming_the_field():
    user = [{"role": "user", "content": "hi"}]
    _refused({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image", "source": {"type": "base64", "data": ""}}]}]},
        "messages[0].content[1].type", "type='image' is not supported: this server reads text, tool_use, tool_result")
    _refused({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]},
        "messages[0].content[0].tool_use_id", "answers no tool_use block")
    _refused({"model": "m", "messages": user}, "max_tokens", "required")
    _refused({"max_tokens": 5, "messages": user}, "model", "required")
    _refused({"model": "m", "max_tokens": 5, "messages": []}, "messages", "non-empty")
    _refused({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role",
             "top-level `system`")  # a system message between turns is read (tests/test_claude_agent_sdk.py)
    _refused({"model": "m", "max_tokens": 5, "messages": user, "temperature": 1.5}, "temperature", "0..1")
    _refused({"model": "m", "max_tokens": 5, "messages": user, "thinking": {"type": "enabled", "budget_tokens": 1024}},
             "thinking", "no extended thinking")
    _refused({"model": "m", "max_tokens": 5, "messages": user, "tools": [{"type": "web_search_20250305", "name": "w"}]},
             "tools[0].type", "no server tools")
    _refused({"model": "m", "max_tokens": 5, "messages": user, "stop_sequences": "."}, "stop_sequences", "list")
    _refused({"model": "m", "max_tokens": 5, "messages": user, "tool_choice": {"type": "sometimes"}}, "tool_choice",
             "auto")
    _refused({"model": "m", "max_tokens": 5, "messages": user, "output_config": {"format": {"type": "json_schema"}}},
             "output_config.format", "plain text")
    _refused([1], None, "JSON object")


def test_an_answer_becomes_a_message_and_a_stop_sequence_is_named():
    assert to_message({}, CHAT) == {
        "id": "msg_abc123", "type": "message", "role": "assistant", "model": "smol",
        "content": [{"type": "text", "text": "Paris."}], "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 3}, "tttr": {"seed": 4}}
    called = to_message({}, CALLED)
    assert called["content"] == [{"type": "text", "text": "Looking."},
                                 {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}]
    assert called["stop_reason"] == "tool_use"
    stopped = {**STOPPED, "tttr": {"seed": 4, "stop_sequence": "is."}}  # the engine names the stop string
    said = to_message({"stop_sequences": ["xx", "is."]}, stopped)
    assert (said["stop_reason"], said["stop_sequence"], said["content"][0]["text"]) == ("stop_sequence", "is.", "Par")
    assert to_message({"stop_sequences": ["xx"]}, stopped)["stop_reason"] == "end_turn"  # not one this request sent
    cut = {**CHAT, "choices": [{**CHAT["choices"][0], "finish_reason": "length"}]}
    assert to_message({"stop_sequences": ["is."]}, cut)["stop_reason"] == "max_tokens"


def _blocks(message) -> list[dict]:
    """A message's content blocks as plain values (a streamed message's have a `parsed_output` too)."""
    return [{k: v for k, v in b.model_dump().items() if k != "parsed_output"} for b in message.content]


@pytest.fixture()
def answering():
    """A real server whose model calls are answered from a 'recording' (the chat answer each
    request's last message names), and the official client pointed at it."""
    import anthropic

    from tttr.engine.serve.modes import FromRecording
    from tttr.engine.serve.server import create_app

    asked: list[dict] = []

    def answer_call(run, endpoint, body):
        asked.append(body)
        last = str(body["messages"][-1]["content"])
        return CALLED if "weather" in last else STOPPED if "stop" in last else CHAT

    running = Running(create_app(FromRecording(answer_call, lambda *a: None, {"id": "smol"})), lifespan="off")
    running.asked = asked
    running.client = anthropic.Anthropic(base_url=running.url, api_key="unused", max_retries=0)
    yield running
    running.stop()


def test_the_official_client_reads_messages_tool_use_and_the_stream(answering):
    client = answering.client
    said = client.messages.create(model="smol", max_tokens=10, messages=[{"role": "user", "content": "Capital?"}])
    assert said.content[0].text == "Paris." and said.stop_reason == "end_turn" and said.usage.input_tokens == 12
    called = client.messages.create(model="smol", max_tokens=10, tools=[TOOL],
                                    messages=[{"role": "user", "content": "weather in Paris?"}])
    assert [b.type for b in called.content] == ["text", "tool_use"] and called.stop_reason == "tool_use"
    assert (called.content[1].id, called.content[1].name, called.content[1].input) == ("call_1", "weather", {"city": "Paris"})
    assert answering.asked[-1]["tools"][0]["function"]["name"] == "weather"
    for request, whole in ((dict(messages=[{"role": "user", "content": "Capital?"}]), said),
                           (dict(tools=[TOOL], messages=[{"role": "user", "content": "weather in Paris?"}]), called)):
        with client.messages.stream(model="smol", max_tokens=10, **request) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_message()
        assert _blocks(final) == _blocks(whole) and final.stop_reason == whole.stop_reason, final
        assert (final.usage.input_tokens, final.usage.output_tokens) == (12, 3)
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "message_delta" in kinds, kinds
    stopping = dict(model="smol", max_tokens=10, stop_sequences=["is."], messages=[{"role": "user", "content": "stop"}])
    whole = client.messages.create(**stopping)  # the recording's stop string, whole and streamed (a replay's answer)
    with client.messages.stream(**stopping) as stream:
        streamed = stream.get_final_message()
    for final in (whole, streamed):
        assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", "is.", "Par"), final
    # a user turn answering the tool call: its result is the chat call's tool message
    client.messages.create(model="smol", max_tokens=10, tools=[TOOL], messages=[
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"}]}])
    assert answering.asked[-1]["messages"][-2:] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


def test_errors_are_anthropics_shape(answering):
    import anthropic

    client = answering.client
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model="smol", max_tokens=10, messages=[
            {"role": "user", "content": [{"type": "document", "source": {"type": "text", "data": "x"}}]}])
    assert info.value.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "messages[0].content[0].type='document' is not supported: this server reads text, tool_use, "
                   "tool_result blocks"}}
    with pytest.raises(anthropic.BadRequestError, match="not recorded") as info:  # a replay has no model to count with
        client.messages.count_tokens(model="smol", messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"
    before = len(answering.asked)
    with pytest.raises(anthropic.BadRequestError):  # refused before it is a call: nothing asked of the recording
        client.messages.create(model="smol", max_tokens=10, stop_sequences=[""], messages=[{"role": "user", "content": "hi"}])
    assert len(answering.asked) == before


def test_a_loading_model_and_a_chat_refusal_reach_the_client_in_anthropics_shape():
    import anthropic

    from tttr.engine.serve.modes import Live
    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.service import Service

    service = Service()
    running = Running(create_app(Live(service)), lifespan="off")  # never loaded
    hi = [{"role": "user", "content": "hi"}]
    try:
        client = anthropic.Anthropic(base_url=running.url, api_key="unused", max_retries=0)
        for stream in (False, True):
            with pytest.raises(anthropic.InternalServerError) as info:
                client.messages.create(model=service.model_id, max_tokens=5, stream=stream, messages=hi)
            assert info.value.status_code == 503 and info.value.body["type"] == "error", info.value.body
            assert info.value.body["error"]["type"] == "api_error" and "loading" in info.value.body["error"]["message"]
        with pytest.raises(anthropic.InternalServerError):
            client.messages.count_tokens(model=service.model_id, messages=hi)
        with pytest.raises(anthropic.NotFoundError) as info:  # the chat check's refusal, told in Anthropic's shape
            client.messages.create(model="claude-haiku-4-5", max_tokens=5, messages=hi)
        assert info.value.body["error"]["type"] == "not_found_error" and "--any-model" in info.value.body["error"]["message"]
    finally:
        running.stop()


# ---------------------------------------------------------------------------- the default model
@pytest.mark.slow
def test_the_engine_answers_streams_counts_stops_and_records_messages(tmp_path):
    import anthropic

    from tttr.sessions.store import Store

    served = recording_server(tmp_path / "calls.db")
    try:
        client = anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0,
                                     default_headers={"X-TTTR-Run": "messages"})
        model = served.service.model_id
        asked = dict(model=model, max_tokens=16, system="You are terse.", extra_body={"temperature": 0, "seed": 3},
                     messages=[{"role": "user", "content": "Say hello"}, {"role": "assistant", "content": "Hi."},
                               {"role": "user", "content": [{"type": "text", "text": "Name three colors."}]}])
        whole = client.messages.create(**asked)
        text = whole.content[0].text
        assert text and whole.stop_reason in ("end_turn", "max_tokens") and whole.usage.output_tokens > 0
        counted = client.messages.count_tokens(model=model, system=asked["system"], messages=asked["messages"])
        assert counted.input_tokens == whole.usage.input_tokens > 0
        with client.messages.stream(**asked) as stream:
            pieces = list(stream.text_stream)
            streamed = stream.get_final_message()
        assert "".join(pieces) == text and _blocks(streamed) == _blocks(whole) and len(pieces) > 1
        assert streamed.usage.input_tokens == whole.usage.input_tokens
        word = next(w for w in text.split()[1:] if text.index(w) > 0)  # a later word of the greedy answer
        stopped = client.messages.create(**asked, stop_sequences=["@@", word])
        assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", word), stopped
        assert stopped.content[0].text == text[:text.index(word)]
        with pytest.raises(anthropic.BadRequestError, match="does not support tools"):  # SmolLM2: no tool format
            client.messages.create(**asked, tools=[TOOL])
    finally:
        served.stop()
        served.recorder.close()
    with Store.open(served.db, readonly=True) as store:
        run = next(r for r in store.runs() if r.task == "messages")
        prompts = [e.value for e in store.events(run.id, kind="prompt")]
        said = [e.value for e in store.events(run.id, kind="message")]
    assert [m.get("stop_sequence") for m in said] == [None, None, word]  # stored only where a stop string ended it
    assert len(prompts) == 3  # one chat call each (counting tokens is not a call), recorded as chat calls are
    assert prompts[0]["request"]["messages"][0] == {"role": "system", "content": "You are terse."}
    assert prompts[1]["request"]["stream"] is True and prompts[2]["request"]["stop"] == ["@@", word]


@pytest.mark.slow
@needs_sandbox
def test_the_anthropic_example_agent_records_replays_and_forks_in_the_sandbox(tmp_path, capsys):
    task = ROOT / "assets" / "tasks" / "write-line"
    tree = tmp_path / "work"
    tree.mkdir()
    subprocess.run(["sh", str(task / "setup.sh")], cwd=tree, check=True)
    shutil.copy(ROOT / "assets" / "examples" / "anthropic_agent.py", tree)
    shutil.copy(task / "check.sh", tree)
    db = tmp_path / "agent.db"
    clock = json.loads((task / "task.json").read_text())["clock"]
    rec = cli_json(capsys, ["record", "--db", str(db), "--tree", str(tree), "--seed", "1", "--clock", clock,
                            "--check", "sh check.sh", "--json", "--", "python3", "anthropic_agent.py"])
    assert rec["exit_code"] == 0 and rec["passed"] is True and rec["calls"] == 2, rec["stderr"]
    assert "greeting.txt: 'hello world' (exit 0)" in rec["stdout"]
    res = replay_json(capsys, db, rec["run_id"])
    # The program's clock reads are sites (S:clock): its realtime reads are counted apart from its
    # monotonic ones, so a socket's timeout loop does not move them and the replay is identical.
    assert res["identical"] is True, res.get("divergence")
    assert res["stdout"] == rec["stdout"] and res["exit_code"] == 0 and res["same_tree"] is True, res
    assert res["logits_computed"] == 0 and res["tools_run"] == 0, res
    fork = cli_json(capsys, ["fork", str(rec["run_id"]), "--db", str(db), "--at", "1:tool",
                             "--set", '["README", "greeting.txt"]', "--json"])
    assert fork["exit_code"] == 1 and "greeting.txt exists already" in fork["stdout"], fork
    assert fork["calls_generated"] == 0 and fork["logits_computed"] == 0


def test_an_anthropic_upstream_is_detected_or_named():
    from tttr.engine.serve.proxy_anthropic import upstream_format

    assert upstream_format("https://api.anthropic.com", None) == "anthropic"
    assert upstream_format("http://127.0.0.1:8001/v1", None) == "openai"
    assert upstream_format("https://evil-anthropic.com.example", None) == "openai"
    assert upstream_format("http://127.0.0.1:8001", "anthropic") == "anthropic"


@pytest.mark.slow
def test_a_proxy_records_an_upstream_messages_api_and_the_run_replays(tmp_path, capsys):
    """`tttr serve --upstream URL --upstream-format anthropic` in front of a server that speaks
    Messages (a `tttr serve`): the official client gets the upstream's answers, whole and streamed,
    and each call is recorded as the chat call it means, which `tttr replay` replays."""
    import anthropic
    import openai

    from tttr.app.cli import main
    from tttr.engine.serve.proxy_anthropic import AnthropicUpstream, ProxiedMessages
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.engine.serve.server import create_app
    from tttr.sessions.store import Store

    served = recording_server(tmp_path / "upstream.db")
    proxy_db = tmp_path / "proxy.db"
    proxy_recorder = CallRecorder(proxy_db, None)
    proxy = Running(create_app(ProxiedMessages(AnthropicUpstream(served.url, key="secret")), proxy_recorder))
    try:
        client = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0,
                                     default_headers={"X-TTTR-Run": "proxied"})
        asked = dict(model=served.service.model_id, max_tokens=12, system="Be brief.",
                     messages=[{"role": "user", "content": "Name a fruit."}], extra_body={"temperature": 0})
        whole = client.messages.create(**asked)
        with client.messages.stream(**asked) as stream:
            streamed = stream.get_final_message()
        assert whole.content[0].text and _blocks(streamed) == _blocks(whole), (whole, streamed)
        assert client.messages.count_tokens(model=asked["model"], system="Be brief.",
                                            messages=asked["messages"]).input_tokens == whole.usage.input_tokens
        with pytest.raises(openai.BadRequestError, match="speaks Anthropic's Messages API"):
            openai.OpenAI(base_url=proxy.url + "/v1", api_key="unused", max_retries=0).chat.completions.create(
                model=asked["model"], messages=[{"role": "user", "content": "hi"}])
    finally:
        proxy.stop()
        proxy_recorder.close()
        served.stop()
        served.recorder.close()
    with Store.open(proxy_db, readonly=True) as store:
        (run,) = store.runs()
        prompts = [e.value for e in store.events(run.id, kind="prompt")]
        messages = [e.value for e in store.events(run.id, kind="message")]
        tokens = [e.value for e in store.events(run.id, kind="token")]
    assert run.meta["tensor"] == "not recorded" and len(prompts) == 2
    assert prompts[0]["request"]["messages"] == [{"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Name a fruit."}]
    assert prompts[0]["sent"]["system"] == "Be brief." and "secret" not in json.dumps(prompts)
    assert [m["text"] for m in messages] == [whole.content[0].text] * 2 and tokens[0]["id_source"] == "retokenized"
    assert main(["replay", str(run.id), "--db", str(proxy_db)]) == 0
    out = capsys.readouterr().out
    assert "identical to the recording" in out, out


def test_the_serve_command_refuses_an_upstream_format_without_an_upstream(capsys):
    from tttr.app.cli import main

    assert main(["serve", "--upstream-format", "anthropic"]) == 2
    err = capsys.readouterr().err
    assert "--upstream-format needs --upstream URL" in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit) as info:  # argparse's choices
        main(["serve", "--upstream", "http://127.0.0.1:9", "--upstream-format", "claude"])
    assert info.value.code == 2 and "invalid choice" in capsys.readouterr().err
