"""`POST /v1/responses`: OpenAI's Responses API over the chat machinery. The translation
both ways and the stream's events are checked without a model, against the official
client's own types; the tests marked slow run the default model through a real server."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tttr.engine.serve.errors import APIError
from tttr.engine.serve.responses_api import from_chat_stream, to_chat, to_response
from serve_helpers import Running, recording_server

CHAT = {"id": "chatcmpl-abc123", "object": "chat.completion", "created": 1767225600, "model": "smol",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop",
                     "logprobs": None}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}, "tttr": {"seed": 4}}
CALLED = {**CHAT, "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
    "role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": "{}"}}]}}]}


def _refused(body, param: str | None) -> APIError:
    with pytest.raises(APIError) as info:
        to_chat(body)
    assert info.value.status == 400 and info.value.param == param, info.value.to_json()
    return info.value


# ---------------------------------------------------------------------------- no model
def test_a_string_input_with_instructions_is_a_system_and_a_user_message():
    chat = to_chat({"model": "gpt-4.1-mini", "input": "Capital of France?", "instructions": "Be brief.",
                    "max_output_tokens": 20, "temperature": 0, "top_p": 0.5, "store": True, "reasoning": {},
                    "text": {"format": {"type": "text"}, "verbosity": "low"}, "metadata": {"a": "b"}})
    assert chat == {"messages": [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Capital of France?"}],
                    "model": "gpt-4.1-mini", "temperature": 0, "top_p": 0.5, "max_tokens": 20}
    assert to_chat({"input": "hi", "parallel_tool_calls": False})["parallel_tool_calls"] is False  # one call at most
    assert "stream" not in to_chat({"input": "hi"})
    assert to_chat({"input": "hi", "stream": True})["stream_options"] == {"include_usage": True}  # usage for the end


def test_logprobs_are_asked_for_by_include_or_by_top_logprobs():
    asked = to_chat({"input": "hi", "include": ["message.output_text.logprobs", "reasoning.encrypted_content"]})
    assert (asked["logprobs"], asked["top_logprobs"]) == (True, 0)  # the chosen tokens', no alternatives
    assert (to_chat({"input": "hi", "top_logprobs": 3})["top_logprobs"]) == 3
    assert "logprobs" not in to_chat({"input": "hi", "include": []}) and "logprobs" not in to_chat({"input": "hi"})
    _refused({"input": "hi", "include": "message.output_text.logprobs"}, "include")
    _refused({"input": "hi", "include": [3]}, "include")


def test_items_become_the_conversation_with_its_tool_calls_and_their_outputs():
    chat = to_chat({"input": [
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather "},
                                                        {"type": "input_text", "text": "and time?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call", "call_id": "c2", "name": "time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "09:00"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny, 9 o'clock."}]},
    ], "tools": [{"type": "function", "name": "weather", "description": "Weather in a city",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": True},
                 {"type": "function", "name": "time"}], "tool_choice": "auto"})
    assert chat["messages"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather and time?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}},
            {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "09:00"},
        {"role": "assistant", "content": "Sunny, 9 o'clock."},
    ]
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "weather", "description": "Weather in a city", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "time", "parameters": {"type": "object", "properties": {}}}}]
    assert chat["tool_choice"] == "auto"
    assert to_chat({"input": "hi", "tools": [{"type": "function", "name": "t"}],
                    "tool_choice": {"type": "function", "name": "t"}})["tool_choice"] == {
        "type": "function", "function": {"name": "t"}}  # the chat check refuses forcing, with its reason


@pytest.mark.parametrize("body, param, words", [
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id", "keeps no responses"),
    ({"input": "hi", "conversation": "conv_1"}, "conversation", "whole conversation in `input`"),
    ({"input": "hi", "background": True}, "background", "answers while you wait"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]", "function tools only"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]",
     "text parts"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format",
     "plain text"),
    ({"input": [{"role": "critic", "content": "x"}]}, "input[0].role", "use one of"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", "function_call_output"),
    ({"input": [{"type": "function_call", "name": "t", "arguments": "{}"}]}, "input[0].call_id", "must be a string"),
    ({"input": [{"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "c1", "output": "x"}]},
     "input[1].call_id", "answers no function_call item before it"),  # as OpenAI refuses it
    ({"input": []}, "input", "non-empty"),
    ({}, "input", "non-empty"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input", "no message"),
    ({"input": "hi", "instructions": 3}, "instructions", "string"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x \ud800"}]}]},
     "input[0].content[0].text", "lone UTF-16 surrogate"),  # was a 500 from the tokenizer
    (["hi"], None, "JSON object"),
])
def test_what_has_no_chat_counterpart_is_refused_naming_the_parameter(body, param, words):
    assert words in str(_refused(body, param))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
KEYS = st.sampled_from(["input", "instructions", "tools", "tool_choice", "text", "max_output_tokens", "type", "role",
                        "content", "call_id", "name", "arguments", "output", "model", "stream", "background"])
ITEM = st.dictionaries(KEYS, JSON | st.sampled_from(["message", "function_call", "function_call_output", "user",
                                                     "input_text", "function"]), max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, JSON | st.lists(ITEM, max_size=3) | ITEM, max_size=6))
def test_any_json_body_is_translated_or_refused_with_a_400(body):
    """A hostile or confused client gets a 400 naming what is wrong, never a server error."""
    try:
        chat = to_chat(body)
    except APIError as exc:
        assert exc.status == 400 and exc.to_json()["error"]["message"]
        return
    assert chat["messages"] and all(m["role"] in ("system", "user", "assistant", "tool") for m in chat["messages"])


def test_a_chat_answer_is_a_response_the_official_client_reads():
    from openai.types.responses import Response

    body = {"model": "gpt-4.1-mini", "input": "Capital of France?", "instructions": "Be brief.", "temperature": 0}
    out = to_response(body, CHAT)
    r = Response.model_validate(out)
    assert r.id == "resp_abc123" and r.status == "completed" and r.output_text == "Paris."
    assert r.created_at == CHAT["created"] and r.model == "smol" and r.instructions == "Be brief."
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (12, 3, 15)
    assert out["tttr"] == {"seed": 4}  # TTTR's own fields ride along, as in chat answers

    cut = Response.model_validate(to_response(body, {**CHAT, "choices": [
        {**CHAT["choices"][0], "finish_reason": "length"}]}))
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"

    called = Response.model_validate(to_response(body, CALLED))
    assert [(o.type, o.call_id, o.name, o.arguments) for o in called.output] == [
        ("function_call", "call_1", "weather", "{\"city\": \"Paris\"}"), ("function_call", "call_2", "time", "{}")]
    assert len({o.id for o in called.output}) == 2 and called.output_text == ""


def _sse(obj) -> dict:
    return {"data": json.dumps(obj)}


def _streamed(body: dict, chunks: list[dict]) -> list:
    """from_chat_stream over `chunks` (chat stream SSE dicts): its events, read as the official client's types."""
    import asyncio

    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    async def source():
        for c in chunks:
            yield c

    async def collect():
        return [e async for e in from_chat_stream(body, source())]

    raw = asyncio.run(collect())
    events = [TypeAdapter(ResponseStreamEvent).validate_python(json.loads(e["data"])) for e in raw]
    assert [e["event"] for e in raw] == [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events


def _chunk(delta: dict, finish=None, **extra) -> dict:
    return _sse({"id": "chatcmpl-abc123", "object": "chat.completion.chunk", "created": 1767225600, "model": "smol",
                 "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra})


@pytest.mark.parametrize("chat", [CHAT, CALLED], ids=["text", "tool calls"])
def test_a_replayed_chat_stream_becomes_the_responses_event_sequence(chat):
    import asyncio

    from openai.types.responses import Response

    from tttr.engine.serve.modes import _replayed_stream

    async def chunks():
        return [c async for c in _replayed_stream(chat, "chat", True)]

    events = _streamed({"input": "x"}, asyncio.run(chunks()))
    assert events[0].type == "response.created" and events[0].response.status == "in_progress"
    final = events[-1].response
    plain = Response.model_validate(to_response({"input": "x"}, chat))  # the stream ends with what the plain call answers
    assert events[-1].type == "response.completed" and final.model_dump(exclude={"tttr"}) == plain.model_dump(
        exclude={"tttr"})  # (a replayed stream's chunks do not carry the answer's tttr fields)
    assert [e.item.id for e in events if e.type == "response.output_item.done"] == [o.id for o in final.output]
    if chat is CHAT:
        assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Paris."
        assert final.usage.output_tokens == 3
    else:
        assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [
            "{\"city\": \"Paris\"}", "{}"]


@pytest.mark.parametrize("sizes, sent", [([2, 4], ["Pa", "ris."]), ([1, "5"], ["Paris."]), ([0, 6], ["Paris."]),
                                         ([True, 5], ["Paris."]), ([2, 2], ["Paris."]), ("6", ["Paris."])])
def test_a_replayed_stream_uses_recorded_pieces_only_when_they_add_up(sizes, sent):
    """A recording's pieces are untrusted: whole numbers above 0 adding up to the text, or the text whole."""
    import asyncio

    from tttr.engine.serve.modes import _replayed_stream

    async def chunks():
        return [json.loads(c["data"]) async for c in _replayed_stream({**CHAT, "tttr": {"pieces": sizes}}, "chat", False)
                if c["data"] != "[DONE]"]

    deltas = [c["choices"][0]["delta"].get("content") for c in asyncio.run(chunks())]
    assert deltas == ["", *sent, None]  # opened as a live stream, then the pieces, then the end


def test_text_is_sent_as_it_comes_and_a_call_in_pieces_is_put_together():
    events = _streamed({"input": "x"}, [
        _chunk({"role": "assistant", "content": ""}), _chunk({"content": "Pa"}), _chunk({"content": "ris"}),
        _chunk({"tool_calls": [{"index": 0, "id": "call_9", "type": "function",
                                "function": {"name": "weather", "arguments": ""}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": "}}]}),
        _chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
        _chunk({}, "tool_calls"), _sse({"id": "chatcmpl-abc123", "choices": [], "usage": CHAT["usage"]}),
        {"data": "[DONE]"}])
    kinds = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["Pa", "ris"] and kinds.count("response.output_item.added") == 2
    assert kinds.index("response.output_text.delta") < kinds.index("response.function_call_arguments.done")
    final = events[-1].response
    assert final.output_text == "Paris" and final.output[1].arguments == "{\"city\": \"Paris\"}"
    assert final.output[1].call_id == "call_9" and final.usage.total_tokens == 15


def test_a_streamed_texts_logprobs_come_with_its_deltas_and_in_the_end():
    def lp(token: str) -> dict:
        return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}

    def probs(delta: dict, *tokens: str) -> dict:
        chunk = _chunk(delta)
        data = json.loads(chunk["data"])
        data["choices"][0]["logprobs"] = {"content": [lp(t) for t in tokens]}
        return {**chunk, "data": json.dumps(data)}

    events = _streamed({"input": "x", "top_logprobs": 1}, [
        _chunk({"role": "assistant", "content": ""}), probs({"content": "Pa"}, "Pa"), probs({}, "\u2581"),
        probs({"content": "ris"}, "ri", "s"), _chunk({}, "stop")])
    deltas = [[p.token for p in e.logprobs] for e in events if e.type == "response.output_text.delta"]
    assert deltas == [["Pa"], ["\u2581", "ri", "s"]]  # a token with no text yet goes with the next delta
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response.output[0].content[0]
    assert [p.token for p in done.logprobs] == [p.token for p in final.logprobs] == ["Pa", "\u2581", "ri", "s"]
    assert _streamed({"input": "x"}, [_chunk({"content": "Pa"}), _chunk({}, "stop")])[-1].response.output[0].content[
        0].logprobs is None  # not asked for: none


def test_a_cut_answer_is_incomplete_and_a_failure_ends_the_stream_with_an_error():
    cut = _streamed({"input": "x"}, [_chunk({"content": "Par"}), _chunk({}, "length")])
    assert cut[-1].type == "response.incomplete" and cut[-1].response.incomplete_details.reason == "max_output_tokens"
    failed = _streamed({"input": "x"}, [_chunk({"content": "Pa"}), _sse(APIError("the engine stopped").to_json())])
    assert failed[-1].type == "error" and "the engine stopped" in failed[-1].message
    context = APIError("… 9 in the prompt, 4 in the completion. Shorten the prompt or lower max_tokens.",
                       param="messages", code="context_length_exceeded")
    told = _streamed({"input": "x"}, [_sse(context.to_json())])[-1]  # in the Responses request's names
    assert told.param == "input" and told.message.endswith("lower max_output_tokens.")
    assert _streamed({"input": "x"}, [])[-1].type == "error"


def test_a_client_gone_closes_the_chat_stream_it_reads():
    import asyncio

    closed = []

    async def source():
        try:
            yield _chunk({"content": "Pa"})
            yield _chunk({"content": "ris"})
        finally:
            closed.append(True)

    async def first_two():
        stream = from_chat_stream({"input": "x"}, source())
        got = [await stream.__anext__(), await stream.__anext__()]
        await stream.aclose()  # as the server does when the client goes away
        return got

    assert len(asyncio.run(first_two())) == 2 and closed == [True]


def test_model_names_match_in_any_case_and_a_recording_service_answers_any():
    from tttr.engine.serve.service import Service

    strict = Service(kernel_mode="invariant")
    strict.check_model(strict.model_id.lower())  # the Agents SDK lowers the name it sends
    strict.check_model(strict.model_id.upper())
    with pytest.raises(APIError, match="does not exist.*--any-model") as info:
        strict.check_model("gpt-4.1-mini")
    assert info.value.status == 404
    Service(kernel_mode="invariant", any_model=True).check_model("gpt-4.1-mini")


# ---------------------------------------------------------------------------- the model
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = recording_server(tmp_path_factory.mktemp("responses") / "calls.db")
    yield running
    running.stop()


@pytest.mark.slow
def test_a_responses_call_is_the_chat_call_it_means_streamed_or_not_and_recorded(served):
    import openai

    from tttr.sessions.store import Store

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    model = served.service.model_id
    asked = dict(model=model, instructions="Answer in one word.", temperature=0.7, max_output_tokens=8)
    r = client.responses.create(input="Name a colour.", extra_body={"seed": 5}, **asked)
    chat = client.chat.completions.create(model=model, seed=5, temperature=0.7, max_tokens=8, messages=[
        {"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Name a colour."}])
    assert r.output_text and r.output_text == chat.choices[0].message.content  # same call, same seed, same text
    assert r.usage.output_tokens == chat.usage.completion_tokens and r.model == model
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")

    events = list(client.responses.create(input="Name a colour.", stream=True, extra_body={"seed": 5}, **asked))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == r.output_text and len(deltas) >= 2, deltas  # sent as generated, not at the end
    assert events[-1].response.output_text == r.output_text
    plain = client.responses.create(input="Name a colour.", top_logprobs=2, extra_body={"seed": 5}, **asked)
    streamed = list(client.responses.create(input="Name a colour.", top_logprobs=2, stream=True,
                                            extra_body={"seed": 5}, **asked))
    sent = [p.model_dump() for e in streamed if e.type == "response.output_text.delta" for p in e.logprobs]
    ended = [p.model_dump() for p in streamed[-1].response.output[0].content[0].logprobs]
    assert [p.model_dump() for p in plain.output[0].content[0].logprobs] == ended == sent and sent
    assert len(sent) == plain.usage.output_tokens - (plain.status == "completed")  # the end token has none
    included = client.responses.create(input="Name a colour.", include=["message.output_text.logprobs"],
                                       extra_body={"seed": 5}, **asked).output[0].content[0].logprobs
    assert [(p.token, p.logprob, p.top_logprobs) for p in included] == [(p["token"], p["logprob"], []) for p in sent]

    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(input="and then?", previous_response_id=r.id, **asked)
    with pytest.raises(openai.NotFoundError, match="does not exist"):  # `tttr serve` names its model
        client.responses.create(input="hi", model="gpt-4.1-mini")
    with Store.open(served.db, readonly=True) as store:  # the five answered calls and the chat one, as chat calls
        prompts = [e for run in store.runs() for e in store.events(run.id, kind="prompt")]
    assert len(prompts) == 6, prompts


def test_a_chat_error_is_told_in_the_responses_names_and_a_loading_model_is_a_503():
    import openai

    from tttr.engine.serve.modes import Live

    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.responses_api import error_from_chat
    from tttr.engine.serve.service import Service

    said = error_from_chat(APIError("messages[2].content is a 'image_url' part", param="messages[2].content").to_json())
    assert said["error"]["param"] == "input"  # the input's items are not the chat messages one for one
    assert error_from_chat(APIError("max_tokens=0 is out of range", param="max_tokens", code="invalid_value").to_json())["error"] == {
        "message": "max_output_tokens=0 is out of range", "type": "invalid_request_error",
        "param": "max_output_tokens", "code": "invalid_value"}
    assert error_from_chat({}) == {}  # a client gone: nothing to tell
    running = Running(create_app(Live(Service())), lifespan="off")  # never loaded
    try:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)
        for stream in (False, True):
            with pytest.raises(openai.InternalServerError) as info:
                client.responses.create(input="hi", stream=stream)
            assert info.value.status_code == 503 and info.value.body["code"] == "model_loading", info.value.body
        with pytest.raises(openai.BadRequestError, match="is not supported") as info:  # refused before the model
            client.responses.create(input="hi", tools=[{"type": "web_search"}])
        assert info.value.body["param"] == "tools[0]"
    finally:
        running.stop()


@pytest.mark.slow
def test_errors_reach_the_official_client_in_openais_shape(served):
    import openai

    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    model = served.service.model_id
    cases = [  # (request, error class, param, code, words)
        (dict(input=[{"type": "item_reference", "id": "msg_1"}]), openai.BadRequestError, "input[0].type",
         "invalid_value", "function_call_output items"),
        (dict(input="hi", tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}]), openai.BadRequestError,
         "tools[0]", "invalid_value", "function tools only"),
        (dict(input="hi", tools=[{"type": "function", "name": "weather", "parameters": {"type": "object"}}]),
         openai.BadRequestError, "tools", "tools_not_supported", "tool_choice=\"none\""),  # SmolLM2: no tool format
        (dict(input="hello " * 9000, max_output_tokens=4), openai.BadRequestError, "input", "context_length_exceeded",
         "lower max_output_tokens"),
        (dict(input="hi", model="gpt-4.1-mini"), openai.NotFoundError, "model", "model_not_found", "does not exist"),
    ]
    for request, error, param, code, words in cases:
        for stream in (False, True):  # a refused stream is refused before its first event
            with pytest.raises(error) as info:
                client.responses.create(**{"model": model, "stream": stream, **request})
            body = info.value.body
            assert set(body) == {"message", "type", "param", "code"}, body
            assert (body["param"], body["code"]) == (param, code) and words in body["message"], body


AGENTS_SDK_PROGRAM = """
import asyncio, json
from agents import Agent, ModelSettings, Runner

settings = ModelSettings(temperature=0, max_tokens=40, extra_body={"stop": ["."]},
                         extra_headers={"X-TTTR-Run": "agents-sdk"})
agent = Agent(name="brief", instructions="Answer in a few words.", model_settings=settings)
first = Runner.run_sync(agent, "Name a colour.")
second = Runner.run_sync(agent, first.to_input_list() + [{"role": "user", "content": "Another one?"}])

async def streamed():
    run = Runner.run_streamed(agent, second.to_input_list() + [{"role": "user", "content": "And a fruit?"}])
    kinds = [e.data.type async for e in run.stream_events() if e.type == "raw_response_event"]
    return run.final_output, kinds

third, kinds = asyncio.get_event_loop().run_until_complete(streamed())  # run_sync's loop: the SDK's client is bound to it
print(json.dumps({"answers": [first.final_output, second.final_output, third], "kinds": kinds,
                  "sent": second.to_input_list()}))
"""


@pytest.mark.slow
def test_an_agents_sdk_program_records_one_run_that_replays_forks_and_diffs(tmp_path, capsys):
    """The journey of docs/serve.md: `tttr serve --db --any-model`, an unmodified Agents SDK program
    pointed at it (run_sync, a second turn from `to_input_list()`, run_streamed), its calls one run
    by `ModelSettings(extra_headers=...)`; then `tttr events`, `replay`, `fork` and `diff` on it."""
    import os
    import subprocess
    import sys

    from tttr.app.cli import main
    from tttr.engine.serve.modes import Live
    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.engine.serve.service import Service
    from tttr.sessions.store import Store

    db = tmp_path / "calls.db"
    service = Service(kernel_mode="invariant", any_model=True)
    recorder = CallRecorder(db, service)
    running = Running(create_app(Live(service), recorder))
    try:
        assert service.wait_ready(300), service.load_error
        env = {**os.environ, "OPENAI_BASE_URL": running.url + "/v1", "OPENAI_API_KEY": "unused",
               "OPENAI_AGENTS_DISABLE_TRACING": "1"}
        done = subprocess.run([sys.executable, "-c", AGENTS_SDK_PROGRAM], env=env, capture_output=True, text=True,
                              timeout=600)
    finally:
        running.stop()
        recorder.close()  # finishes the named run
        service.close()
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    assert all(got["answers"]), got
    replies = [item for item in got["sent"] if item.get("role") == "assistant"]
    assert replies and all(item["type"] == "message" and item["status"] == "completed" and item["id"]
                            and item["content"][0]["type"] == "output_text" for item in replies)  # what it sends back
    kinds = got["kinds"]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.output_text.delta") >= 2, kinds  # streamed as generated

    with Store.open(db, readonly=True) as store:
        (run,) = store.runs()
        assert run.task == "agents-sdk" and run.status == "complete"
        prompts = [e.value for e in store.events(run.id, kind="prompt")]
        messages = [e.value["text"] for e in store.events(run.id, kind="message")]
    assert messages == got["answers"]  # three calls, one run, the answers the program got
    assert [p["request"]["model"] for p in prompts] == [prompts[0]["request"]["model"]] * 3  # the SDK's name, as sent
    assert prompts[1]["request"]["messages"][1:] == [  # turn 1's output item came back as the assistant's turn
        {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": messages[0]},
        {"role": "user", "content": "Another one?"}]
    assert prompts[2]["request"]["stream"] is True and len(prompts[2]["request"]["messages"]) == 6

    assert main(["events", str(run.id), "--db", str(db), "--kind", "message", "--json"]) == 0
    assert [json.loads(line)["site"] for line in capsys.readouterr().out.splitlines()] == [
        "0:message", "1:message", "2:message"]
    assert main(["replay", str(run.id), "--db", str(db), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["identical"] and replayed["calls"] == 3 and replayed["logits_computed"] == 0, replayed
    with Store.open(db, readonly=True) as store:
        recorded = store.event_at(run.id, "0:token:1").value["id"]
        other = next(i for i, _ in store.event_at(run.id, "0:logits:1").value["topk"] if i != recorded)
    assert main(["fork", str(run.id), "--db", str(db), "--at", "0:token:1", "--set", f"id:{other}"]) == 0
    out = capsys.readouterr().out
    assert f"child of {run.id}" in out, out
    forked = int(out.split("forked run ")[1].split()[0])
    assert main(["diff", str(run.id), str(forked), "--db", str(db)]) == 0
    assert "first divergence: 0:token:1 (token layer)" in capsys.readouterr().out
