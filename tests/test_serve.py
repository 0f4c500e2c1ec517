"""`tttr serve`: OpenAI's API on the engine, checked with the official `openai` client
against a real uvicorn server. Request checking and tool-call parsing need no model; the
tests marked slow run the default model (a few tokens each)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tttr.engine.serve.errors import APIError
from tttr.engine.serve.requests import parse_chat, parse_completion
from tttr.engine.serve.responses import TextStream
from tttr.engine.serve.tools import call_format, parse_tool_calls, supports_tools
from serve_helpers import Running, recording_server, free_port

SMOL_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
                 " + '<|im_end|>' + '\\n'}}{% endfor %}")
QWEN_LIKE = ("{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools> Write "
             "<tool_call>{\"name\": ..., \"arguments\": ...}</tool_call>{% endif %}")
USER = [{"role": "user", "content": "hi"}]


# ---------------------------------------------------------------------------- no model
def _refused(parse, body: dict, param: str | None) -> APIError:
    with pytest.raises(APIError) as info:
        parse(body)
    assert info.value.status == 400 and info.value.param == param, info.value.to_json()
    return info.value


def test_chat_requests_are_checked_field_by_field():
    assert "n=2" in _refused(parse_chat, {"messages": USER, "n": 2}, "n").message
    _refused(parse_chat, {"messages": USER, "temperature": -1}, "temperature")
    _refused(parse_chat, {"messages": USER, "temperature": "hot"}, "temperature")
    _refused(parse_chat, {"messages": USER, "stream_options": {"include_usage": True}}, "stream_options")  # as OpenAI
    _refused(parse_completion, {"prompt": "a", "stream": False, "stream_options": {}}, "stream_options")
    _refused(parse_chat, {"messages": USER, "top_p": 0}, "top_p")
    _refused(parse_chat, {"messages": USER, "seed": -1}, "seed")
    _refused(parse_chat, {"messages": USER, "max_tokens": 0}, "max_tokens")
    _refused(parse_chat, {"messages": USER, "top_logprobs": 3}, "top_logprobs")  # needs logprobs
    _refused(parse_chat, {"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs")
    _refused(parse_chat, {"messages": USER, "stop": ["a"] * 5}, "stop")
    _refused(parse_chat, {"messages": []}, "messages")
    _refused(parse_chat, {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role")
    _refused(parse_chat, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
             "messages[0].content")
    _refused(parse_chat, {"messages": USER, "tool_choice": "required",
                          "tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice")
    _refused(parse_completion, {"prompt": ""}, "prompt")
    _refused(parse_completion, {"prompt": "x", "echo": True}, "echo")


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}},
     "response_format"),
    ({"response_format": "json"}, "response_format"),
    ({"frequency_penalty": 1.5}, "frequency_penalty"),
    ({"presence_penalty": -0.5}, "presence_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"),  # out of OpenAI's range
    ({"logit_bias": {"28": 100}}, "logit_bias"),
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),  # the model would not see them
    ({"function_call": {"name": "f"}}, "function_call"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["audio"]}, "modalities"),
    ({"web_search_options": {}}, "web_search_options"),
])
def test_parameters_that_would_change_the_answer_are_refused_not_ignored(extra, param):
    """OpenAI's structured outputs, penalties and logit bias change the answer; this engine
    cannot apply them, so they are refused naming the parameter (they used to be ignored)."""
    for parse, body in ((parse_chat, {"messages": USER}), (parse_completion, {"prompt": "x"})):
        _refused(parse, {**body, **extra}, param)
    # asking for nothing is served: these are the values clients send by default
    assert parse_chat({"messages": USER, "response_format": {"type": "text"}, "frequency_penalty": 0,
                       "presence_penalty": 0.0, "logit_bias": {}, "modalities": ["text"],
                       "function_call": "auto"}).messages[0]["content"] == "hi"


def test_an_assistant_refusal_part_sent_back_is_its_text():
    """OpenAI's assistant content may be a `refusal` part; a client sending the conversation
    back as it got it was refused with a 400."""
    req = parse_chat({"messages": [*USER, {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
                                   {"role": "user", "content": "why?"}]})
    assert req.messages[1] == {"role": "assistant", "content": "No."}


def test_a_lone_surrogate_is_a_400_naming_where_it_is():
    """JSON can carry half a UTF-16 pair ("\\ud83d"); the tokenizer cannot take it (that was a 500)."""
    err = _refused(parse_chat, {"messages": [{"role": "user", "content": "ok \U0001f389 \ud83d"}]}, "messages[0].content")
    assert "surrogate" in err.message and "character 5" in err.message
    _refused(parse_chat, {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]},
             "messages[0].content[0].text")
    _refused(parse_chat, {"messages": USER, "stop": ["ok", "\udc00"]}, "stop[1]")
    _refused(parse_completion, {"prompt": "a\ud800"}, "prompt")
    _refused(parse_chat, {"messages": USER, "metadata": {"\ud800": "x"}}, "metadata")  # a key
    assert parse_chat({"messages": [{"role": "user", "content": "日本語 \U0001f389"}]}).messages[0]["content"] == "日本語 \U0001f389"


def test_a_chat_request_is_normalised():
    req = parse_chat({
        "model": "m", "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
        ],
        "max_completion_tokens": 7, "stop": "END", "seed": 3, "stream": True,
        "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2, "top_k": -1,
        "frequency_penalty": 0, "user": "u1",  # asks for nothing / only for OpenAI's service: accepted
    })
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "tool"]
    assert req.messages[1]["content"] == "ab" and req.messages[2]["content"] == ""
    assert req.messages[2]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert (req.max_tokens, req.stop, req.seed, req.top_k, req.include_usage, req.top_logprobs) == (7, ("END",), 3, 0, True, 2)
    assert req.temperature == 1.0  # OpenAI's default
    assert parse_completion({"prompt": [[1, 2, 3]]}).prompt == (1, 2, 3)


def test_tool_support_is_read_from_the_template():
    assert not supports_tools(SMOL_TEMPLATE) and not supports_tools(None)
    assert supports_tools(QWEN_LIKE) and call_format(QWEN_LIKE) == "hermes"


def test_tool_calls_are_parsed_back():
    text = 'Let me check.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    rest, calls = parse_tool_calls(text, "hermes", {"weather"})
    assert rest == "Let me check." and len(calls) == 1
    assert calls[0].name == "weather" and json.loads(calls[0].arguments) == {"city": "Paris"}
    assert parse_tool_calls(text, "hermes", {"other"}) == (text, [])  # not a tool it was given
    assert parse_tool_calls("<tool_call>{not json</tool_call>", "hermes", None)[1] == []
    rest, calls = parse_tool_calls('{"name": "f", "parameters": {"a": 1}}', "json", {"f"})
    assert rest == "" and calls[0].arguments == '{"a": 1}'
    assert parse_tool_calls("just words", "json", {"f"}) == ("just words", [])


class _CharTokenizer:
    stop_token_ids = (0,)

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_streamed_text_holds_back_what_could_become_a_stop_string():
    stream = TextStream(_CharTokenizer(), ("END",))
    out = "".join(stream.push(ord(c)) for c in "abcEN")
    assert out == "abc"  # "EN" may still become "END"
    out += "".join(stream.push(ord(c)) for c in "Dxyz")
    assert out + stream.flush() == "abc" and stream.stopped
    stream = TextStream(_CharTokenizer(), ())
    assert "".join(stream.push(ord(c)) for c in "hello") + stream.flush() == "hello"


def test_a_streamed_answers_pieces_are_what_the_stream_sends():
    from tttr.engine.serve.responses import stream_pieces

    ids = [ord(c) for c in "abcENDxyz"]
    assert stream_pieces(_CharTokenizer(), ids, ("END",)) == [1, 1, 1]  # "abc", then the stop string
    assert stream_pieces(_CharTokenizer(), [ord(c) for c in "hello"], ("lo!",)) == [1, 1, 1, 2]  # "lo" held to the end
    assert stream_pieces(_CharTokenizer(), [], ()) == []


def _pieces_decoding_everything(tokenizer, ids, stops):
    """The reference: each token decodes the whole answer again (TextStream before it kept a window)."""
    hold, sent, pieces, kept = max((len(s) for s in stops), default=1) - 1, 0, [], []
    for i in ids:
        if i in tokenizer.stop_token_ids:
            continue
        kept.append(i)
        text = tokenizer.decode(kept)
        if text.endswith("\ufffd"):
            continue
        at = min((k for k in (text.find(s) for s in stops) if k >= 0), default=-1)
        if at >= 0:
            pieces.append(at - sent)
            return [p for p in pieces if p]
        end = max(sent, len(text) - hold)
        pieces.append(end - sent)
        sent = end
    pieces.append(len(tokenizer.decode(kept)) - sent)
    return [p for p in pieces if p]


@pytest.fixture(scope="module")
def smol_tokenizer():
    from tttr.engine.inference.model import load_model

    return load_model().tokenizer


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_streamed_pieces_decode_a_window_yet_match_decoding_everything(smol_tokenizer, data):
    """Byte tokens (half a character), emoji, special tokens and stop strings: the windowed
    stream sends what decoding the whole answer per token sends, and its text is the whole text."""
    tok = smol_tokenizer
    words = ["h\u00e9", " \u00fcber", " \U0001F600", "\u4e2d\u6587", " END", "\n", " x", "EN", "D"]
    text = "".join(data.draw(st.lists(st.sampled_from(words), max_size=12)))
    ids = tok.encode(text, add_bos=False)
    ids = data.draw(st.permutations(ids)) if data.draw(st.booleans()) else ids  # split characters apart
    ids += data.draw(st.lists(st.integers(0, tok.vocab_size - 1), max_size=4))
    stops = tuple(data.draw(st.lists(st.sampled_from(["END", "\n", "\U0001F600", "xyz"]), max_size=2)))
    stream = TextStream(tok, stops)
    sent = [d for d in map(stream.push, ids) if d]
    last = stream.flush()
    got = [len(d) for d in sent] + ([len(last)] if last else [])
    assert got == _pieces_decoding_everything(tok, ids, stops)
    kept = [i for i in ids if i not in tok.stop_token_ids]
    whole = tok.decode(kept)
    if not stream.stopped:
        assert "".join(sent) + last == whole


def test_a_tool_call_in_the_text_becomes_tool_calls():
    from types import SimpleNamespace

    from tttr.engine.serve.responses import output
    from tttr.engine.serve.service import Call, Prepared

    text = '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
    req = parse_chat({"messages": USER, "tools": [{"type": "function", "function": {"name": "weather"}}]})
    prepared = Prepared(req, (1, 2), seed=1, seed_drawn=False, max_tokens=99, tool_format="hermes",
                        tool_names=frozenset({"weather"}))
    records = [SimpleNamespace(token_id=ord(c)) for c in text] + [SimpleNamespace(token_id=0)]
    call = Call(prepared, SimpleNamespace(records=records, finish_reason="stop"), future=None, created=0, started=0)
    out = output(call, _CharTokenizer())
    assert out.finish_reason == "tool_calls" and out.text == "" and out.completion_tokens == len(text) + 1
    assert out.tool_calls[0].to_json("c")["function"] == {"name": "weather", "arguments": '{"city": "Paris"}'}


def test_parallel_tool_calls_false_answers_one_call_at_most():
    """OpenAI's `parallel_tool_calls: false` means one call at most; it was accepted and ignored."""
    from types import SimpleNamespace

    from tttr.engine.serve.responses import output
    from tttr.engine.serve.service import Call, Prepared

    text = ('<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
            '<tool_call>{"name": "weather", "arguments": {"city": "Rome"}}</tool_call>')
    tools = [{"type": "function", "function": {"name": "weather"}}]
    records = [SimpleNamespace(token_id=ord(c)) for c in text] + [SimpleNamespace(token_id=0)]
    cities = {}
    for parallel in (None, True, False):
        body = {"messages": USER, "tools": tools} | ({} if parallel is None else {"parallel_tool_calls": parallel})
        prepared = Prepared(parse_chat(body), (1, 2), seed=1, seed_drawn=False, max_tokens=99, tool_format="hermes",
                            tool_names=frozenset({"weather"}))
        call = Call(prepared, SimpleNamespace(records=records, finish_reason="stop"), future=None, created=0, started=0)
        out = output(call, _CharTokenizer())
        assert out.finish_reason == "tool_calls" and out.text == ""
        cities[parallel] = [json.loads(c.arguments)["city"] for c in out.tool_calls]
    assert cities == {None: ["Paris", "Rome"], True: ["Paris", "Rome"], False: ["Paris"]}
    _refused(parse_chat, {"messages": USER, "parallel_tool_calls": "no"}, "parallel_tool_calls")


def test_the_domain_side_never_loads_the_http_stack():
    import subprocess
    import sys

    code = ("import sys, tttr.engine.serve.service, tttr.engine.serve.responses, tttr.engine.serve.recorder, "
            "tttr.engine.serve.proxy, tttr.engine.bench.serve; "
            "print(sorted(m for m in ('starlette', 'uvicorn', 'sse_starlette') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr or out.stdout


# ---------------------------------------------------------------------------- a server
def _http(url: str, data: bytes | None = None, method: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_errors_have_openai_shape_while_the_model_loads():
    from tttr.engine.serve.modes import Live
    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.service import Service

    service = Service()  # never loaded: the routes that need it answer 503
    running = Running(create_app(Live(service)), lifespan="off")
    try:
        chat = running.url + "/v1/chat/completions"
        body = json.dumps({"messages": USER}).encode()
        cases = [
            (_http(running.url + "/health"), 503, None),
            (_http(chat, body), 503, "model_loading"),
            (_http(chat, b"{not json"), 400, "invalid_json"),
            (_http(chat, b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), 400, "invalid_json"),  # was a 500
            (_http(chat, b'{"messages": [{"role": "user", "content": "\\ud83d"}]}'), 400, "invalid_value"),
            (_http(chat, json.dumps({"messages": USER, "response_format": {"type": "json_object"}}).encode()), 400,
             "invalid_value"),
            (_http(chat, json.dumps({"messages": USER, "n": 2}).encode()), 400, "invalid_value"),
            (_http(chat, json.dumps({"messages": USER, "model": "gpt-4o"}).encode()), 404, "model_not_found"),
            (_http(running.url + "/v1/nothing"), 404, "not_found"),
            (_http(running.url + "/v1/completions", method="GET"), 405, None),
        ]
        for (status, got), want, code in cases:
            assert status == want, got
            if "error" in got or want != 503:
                assert set(got["error"]) == {"message", "type", "param", "code"} and got["error"]["code"] == code, got
        status, got = _http(running.url + "/v1/models")
        assert status == 200 and got["data"][0]["id"] == service.model_id
    finally:
        running.stop()


# ---------------------------------------------------------------------------- the model
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = recording_server(tmp_path_factory.mktemp("serve") / "calls.db")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(served):
    import openai

    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def _ask(client, content: str, **kw):
    kw = {"max_tokens": 8, "temperature": 0.8, "seed": 11, **kw}
    return client.chat.completions.create(model=client.models.list().data[0].id,
                                          messages=[{"role": "user", "content": content}], **kw)


@pytest.mark.slow
def test_plain_streamed_and_logprobs_agree(client, served):
    plain = _ask(client, "Name a colour.", logprobs=True, top_logprobs=3)
    choice = plain.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length") and plain.usage.completion_tokens >= 1
    assert plain.system_fingerprint == served.service.system_fingerprint
    assert "invariant" in plain.system_fingerprint and plain.model_extra["tttr"]["seed"] == 11
    entries = choice.logprobs.content
    assert entries and all(len(e.top_logprobs) == 3 and e.logprob <= 0 for e in entries)
    assert "".join(bytes(e.bytes).decode("utf-8", "replace") for e in entries) == choice.message.content

    chunks = list(_ask(client, "Name a colour.", stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # same seed, same answer, streamed or not
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [choice.finish_reason]

    unseeded = _ask(client, "Name a colour.", seed=None)
    drawn = unseeded.model_extra["tttr"]
    assert drawn["seed_drawn"] and isinstance(drawn["seed"], int)
    again = _ask(client, "Name a colour.", seed=drawn["seed"])
    assert again.choices[0].message.content == unseeded.choices[0].message.content

    done = client.completions.create(model=plain.model, prompt="The capital of France is", max_tokens=4,
                                     temperature=0, logprobs=2)
    assert done.choices[0].text and len(done.choices[0].logprobs.tokens) >= 1


@pytest.mark.slow
def test_a_seeded_answer_is_the_same_alone_and_under_load(client, served):
    prompts = ["Hi.", "Write one word about the sea.", "Count to three. " * 6, "What is 2+2?",
               "Describe a cat in a short sentence, please. " * 3, "Say yes."]

    def tokens(prompt: str):
        r = _ask(client, prompt, max_tokens=10, logprobs=True, top_logprobs=2)
        return [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in r.choices[0].logprobs.content]

    alone = [tokens(p) for p in prompts[:2]]
    engine = served.service.engine
    history = len(engine.history)
    with ThreadPoolExecutor(len(prompts)) as pool:
        loaded = list(pool.map(tokens, prompts))
    shared = max(len(ids) for _, ids in list(engine.history)[history:])
    assert shared >= 3, f"the requests never shared a pass (at most {shared} sequences in one)"
    assert loaded[:2] == alone  # bit for bit: token ids' text, logprobs, alternatives


@pytest.mark.slow
def test_refusals_with_the_official_client(client):
    import openai

    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError, match="does not support tools"):
        _ask(client, "Weather in Paris?", tools=tools)
    assert _ask(client, "hi", tools=tools, tool_choice="none", max_tokens=2).choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError, match="n=2"):
        _ask(client, "hi", n=2)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-4o", messages=USER)
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, "hello " * 9000)
    message = str(info.value)
    assert "maximum context length is 8192" in message and "in the prompt" in message and "in the completion" in message


@pytest.mark.slow
def test_calls_are_recorded_as_runs(client, served):
    from tttr.app.cli import main
    from tttr.sessions.store import Store

    for content in ("First call.", "Second call."):
        _ask(client, content, max_tokens=3, extra_headers={"X-TTTR-Run": "my-agent"})
    served.recorder.flush()
    with Store.open(served.db, readonly=True) as store:
        runs = [r for r in store.runs() if r.task == "my-agent"]
        assert len(runs) == 1
        run = runs[0]
        assert run.model_id == served.service.model_id and run.kernel_mode == "invariant" and run.seed == 11
        events = list(store.events(run.id))
        kinds = [(e.step, e.kind) for e in events]
        assert (0, "prompt") in kinds and (1, "prompt") in kinds and (1, "message") in kinds
        prompt = next(e for e in events if e.kind == "prompt").value
        assert prompt["n_tokens"] == len(prompt["ids"]) and prompt["sampling"]["seed"] == 11
        assert prompt["request"]["messages"][0]["content"] == "First call."
        token = next(e for e in events if e.kind == "token")
        logits = next(e for e in events if e.kind == "logits")
        assert token.layer == "token" and token.value["rng"] == [11, 0, 0]
        assert logits.layer == "tensor" and logits.value["mode"] == "invariant" and len(logits.value["topk"]) == 5
    assert main(["events", str(served.db), str(run.id), "--kind", "message"]) == 0


@pytest.mark.slow
def test_a_client_that_goes_away_frees_its_sequence(client, served):
    from tttr.sessions.store import Store

    stream = _ask(client, "Tell me a very long story about a dragon.", max_tokens=400, stream=True,
                  extra_headers={"X-TTTR-Run": "gone"})
    next(iter(stream))
    next(iter(stream))
    stream.close()
    engine = served.service.engine
    deadline = time.time() + 30
    while engine._running or engine._waiting:
        assert time.time() < deadline, "the cancelled sequence kept running"
        time.sleep(0.05)
    served.recorder.flush()
    with Store.open(served.db, readonly=True) as store:
        run = next(r for r in store.runs() if r.task == "gone")
        message = [e for e in store.events(run.id) if e.kind == "message"][0].value
        tokens = [e for e in store.events(run.id) if e.kind == "token"]
    assert message["finish_reason"] == "cancelled" and 1 <= len(tokens) < 400


@pytest.mark.slow
def test_bad_requests_among_good_ones_leave_the_server_and_database_whole(client, served):
    import sqlite3

    chat = served.url + "/v1/chat/completions"
    bad = [b"{", b"[]", b"null", json.dumps({"messages": USER, "n": 3}).encode(),
           json.dumps({"messages": USER, "temperature": "x"}).encode(), json.dumps({"messages": "hi"}).encode(),
           json.dumps({"messages": USER, "model": "nope"}).encode(), b"\xff\xfe",
           json.dumps({"messages": [{"role": "user", "content": "word " * 20000}]}).encode()]  # past the context
    jobs = [("bad", bad[i % len(bad)]) for i in range(300)]
    jobs[7::50] = [("bad", b"x" * (17 << 20))] * len(jobs[7::50])  # past the body limit
    jobs[::30] = [("good", None)] * len(jobs[::30])

    def send(job):
        kind, body = job
        if kind == "good":
            return kind, _ask(client, "Say one word.", max_tokens=3).choices[0].message.content
        try:
            status, got = _http(chat, body)
        except (urllib.error.URLError, ConnectionError):  # a huge body may be cut off once refused
            return kind, 413
        assert set(got["error"]) == {"message", "type", "param", "code"}
        return kind, status

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(send, jobs))
    assert all(isinstance(r, str) for kind, r in results if kind == "good")
    assert all(r in (400, 404, 413) for kind, r in results if kind == "bad")
    assert _http(served.url + "/health")[0] == 200
    served.recorder.flush()
    with sqlite3.connect(served.db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


@pytest.mark.slow
def test_the_command_starts_serves_and_stops_cleanly_on_ctrl_c(tmp_path):
    import signal
    import subprocess
    import sys

    from tttr.sessions.store import Store

    port, db = free_port(), tmp_path / "cli.db"
    proc = subprocess.Popen([sys.executable, "-m", "tttr.app", "serve", "--port", str(port), "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/v1" in first and "kernels invariant" in first, first
        deadline = time.time() + 120
        while True:
            try:
                if _http(f"http://127.0.0.1:{port}/health")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        body = json.dumps({"messages": USER, "max_tokens": 2, "seed": 5}).encode()
        status, got = _http(f"http://127.0.0.1:{port}/v1/chat/completions", body)
        assert status == 200 and got["tttr"]["seed"] == 5
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err and "stopped" in err, err
    with Store.open(db, readonly=True) as store:
        assert [r.status for r in store.runs()] == ["complete"]


@pytest.mark.slow
def test_engine_cancel_drops_a_waiting_sequence_before_prefill_and_a_running_one(served):
    from tttr.engine.inference.sampler import SamplingParams
    from tttr.engine.inference.scheduler import Engine
    from tttr.engine.inference.sequence import Sequence

    tok = served.service.tokenizer
    engine = Engine(served.service.model, kernel_mode="invariant", max_running=1)
    try:
        first = Sequence(tok.encode("Once upon a time"), SamplingParams(seed=1), 40)
        second = Sequence(tok.encode("The sea is"), SamplingParams(seed=2), 40)
        running, waiting = engine.submit(first), engine.submit(second)
        assert engine.cancel(second)  # one runs at a time: the second still waits
        assert waiting.result(5) == [] and second.finish_reason == "cancelled"
        deadline = time.time() + 60
        while not first.records:
            assert time.time() < deadline, "the first sequence never produced a token"
            time.sleep(0.01)
        assert engine.cancel(first)
        records = running.result(60)
        assert first.finish_reason == "cancelled" and 1 <= len(records) < 40
        assert not engine.cancel(first) and not engine._running and not engine._waiting
        assert all(id(second) not in ids for _, ids in engine.history)  # never prefilled
    finally:
        engine.close()


def _serve_process(port: int):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "tttr.app", "serve", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while True:
        try:
            if _http(f"http://127.0.0.1:{port}/health")[0] == 200:
                return proc
        except (urllib.error.URLError, ConnectionError):
            pass
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() is not None else "slow"
        time.sleep(0.2)


@pytest.mark.slow
def test_a_seeded_answer_is_the_same_after_a_restart():
    import signal

    body = json.dumps({"messages": [{"role": "user", "content": "Name three fruits."}], "max_tokens": 12,
                       "temperature": 0.9, "seed": 77, "logprobs": True, "top_logprobs": 3}).encode()
    answers = []
    for _ in range(2):  # two server processes, one after the other
        port = free_port()
        proc = _serve_process(port)
        try:
            status, got = _http(f"http://127.0.0.1:{port}/v1/chat/completions", body)
            assert status == 200, got
            answers.append([(e["token"], e["logprob"], e["top_logprobs"]) for e in got["choices"][0]["logprobs"]["content"]])
        finally:
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert answers[0] and answers[0] == answers[1]  # bit for bit: tokens, logprobs, alternatives


def test_bench_serve_has_help(capsys):
    from tttr.app.cli import build_parser

    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["bench", "serve", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "--tokens" in out and "--rounds" in out and "--json" in out
    args = build_parser().parse_args(["bench", "serve", "--tokens", "8", "--rounds", "1", "--json"])
    assert (args.tokens, args.rounds, args.json) == (8, 1, True)


def test_an_abandoned_calls_outcome_is_not_logged_as_never_retrieved():
    """A plain request whose client went away: its call ends later with `Cancelled`, which
    nobody awaits; asyncio used to log it as "Future exception was never retrieved"."""
    import asyncio
    import concurrent.futures
    import gc
    from types import SimpleNamespace

    from tttr.engine.serve.modes import wait
    from tttr.engine.serve.service import Cancelled

    class Gone:
        async def is_disconnected(self):
            return True

    cancelled: list = []

    async def main() -> list:
        logged: list = []
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: logged.append(context["message"]))
        future = concurrent.futures.Future()
        call = SimpleNamespace(future=future, cancel=lambda: cancelled.append(True))
        assert await wait(Gone(), call) is False
        future.set_exception(Cancelled("the client went away"))  # the engine's thread, later
        for _ in range(3):
            await asyncio.sleep(0)  # the outcome reaches the loop's future
        del call, future  # the call is forgotten: its futures are collected
        gc.collect()
        return logged

    assert asyncio.run(main()) == [] and cancelled == [True]


def test_ctrl_c_on_the_server_does_not_log_the_calls_it_cancels_as_errors():
    """uvicorn cancels the requests in flight when it stops and logs each with a CancelledError
    traceback; those calls are cancelled and recorded as they should be, so the log drops them."""
    import asyncio
    import logging
    import sys as _sys

    from tttr.app.commands.serve import quiet_shutdown

    def record(msg: str, exc: BaseException | None = None) -> logging.LogRecord:
        info = None
        if exc is not None:
            try:
                raise exc
            except BaseException:  # noqa: BLE001 - the record carries it, as uvicorn's does
                info = _sys.exc_info()
        return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, msg, None, info)

    assert not quiet_shutdown(record("Exception in ASGI application\n", asyncio.CancelledError()))
    assert not quiet_shutdown(record("ASGI callable returned without completing response."))
    assert quiet_shutdown(record("Exception in ASGI application\n", RuntimeError("a real bug")))
    assert quiet_shutdown(record("Invalid HTTP request received."))


# ---------------------------------------------------------------------------- bodies a server must not take
def _raw(port: int, head: bytes, *parts: bytes) -> tuple[int, dict]:
    """Send `head` and `parts` as they are on a new connection; the response's status and JSON."""
    import http.client
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:  # a hang guard only
        sock.sendall(head)
        for part in parts:
            sock.sendall(part)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())


def _post_head(path: str, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def test_a_body_over_the_limit_is_refused_before_it_is_read():
    """A 15 MiB chat body cost the server 76 s of CPU and 1.7 GiB (the limit was 16 MiB): over
    --max-body-mb (default 8) it is a 413 in OpenAI's shape, from its Content-Length before a
    byte of it is read, and as soon as a chunked body passes the limit."""
    from tttr.engine.serve.modes import Live
    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.requests import MAX_BODY_MB
    from tttr.engine.serve.service import Service

    assert MAX_BODY_MB == 8
    running = Running(create_app(Live(Service())), lifespan="off")
    try:
        limit = MAX_BODY_MB << 20
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/tttr/v1/tool"):
            status, got = _raw(running.port, _post_head(path, content_length=str(limit + 1), x_tttr_run="r"))  # no body
            assert status == 413 and got["error"]["code"] == "request_too_large", got
            assert set(got["error"]) == {"message", "type", "param", "code"} and "8 MiB" in got["error"]["message"]
        status, got = _raw(running.port, _post_head("/v1/chat/completions", transfer_encoding="chunked"),
                           *[_chunk(b" " * (1 << 20))] * MAX_BODY_MB, _chunk(b" "))  # and no last chunk
        assert status == 413 and got["error"]["code"] == "request_too_large", got
        body = json.dumps({"messages": USER}).encode()
        body += b" " * (limit - len(body))  # at the limit: read, and answered (the model is not loaded)
        assert _raw(running.port, _post_head("/v1/chat/completions", content_length=str(limit)), body)[0] == 503
    finally:
        running.stop()


def test_the_body_limit_is_an_option_of_serve():
    import openai

    from tttr.app.cli import build_parser
    from tttr.engine.serve.modes import Live
    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.service import Service

    from tttr.engine.serve.requests import MAX_BODY_MB

    serve = dict(build_parser()._subparsers._group_actions[0].choices)["serve"]
    assert f"(default {MAX_BODY_MB};" in " ".join(serve.format_help().split())  # the help says the default
    assert build_parser().parse_args(["serve", "--max-body-mb", "64"]).max_body_mb == 64
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-body-mb", "0"])
    service = Service()
    running = Running(create_app(Live(service), max_body_mb=1), lifespan="off")
    try:
        status, got = _raw(running.port, _post_head("/v1/chat/completions", content_length=str((1 << 20) + 1)))
        assert status == 413 and "1 MiB" in got["error"]["message"], got
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:  # well under 1 MiB: read, then refused as not loaded
            client.chat.completions.create(model=service.model_id, messages=[{"role": "user", "content": "x" * 500_000}])
        assert info.value.status_code == 503
    finally:
        running.stop()


def test_a_message_without_content_is_a_400_naming_it():
    """`content: null` in a user message was answered 200 (as an empty message); OpenAI answers
    400. Only an assistant message with tool_calls (or a refusal) may have none."""
    call = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    for role in ("user", "system", "developer", "tool", "assistant"):
        err = _refused(parse_chat, {"messages": [*USER, {"role": role, "content": None}]}, "messages[1].content")
        assert err.code == "invalid_value" and "null" in err.message
        err = _refused(parse_chat, {"messages": [{"role": role}]}, "messages[0].content")
        assert err.code == "missing_required_parameter"
    req = parse_chat({"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": call},
                                   {"role": "assistant", "content": None, "refusal": "I can't."}, *USER]})
    assert [m["content"] for m in req.messages] == ["hi", "", "I can't.", "hi"]


def test_a_null_content_is_refused_with_the_official_client():
    import openai

    from tttr.engine.serve.modes import Live

    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.service import Service

    running = Running(create_app(Live(Service())), lifespan="off")  # refused before the model is needed
    try:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="m", messages=[{"role": "system", "content": "Be brief."},
                                                                {"role": "user", "content": None}])
        assert info.value.body["param"] == "messages[1].content", info.value.body
    finally:
        running.stop()


def test_a_client_that_goes_away_mid_body_is_not_an_error(capfd):
    """The server logged a ClientDisconnect traceback; now the call is simply not made."""
    import socket
    import threading

    from tttr.engine.serve.modes import Live

    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.service import Service

    inner = create_app(Live(Service()))
    ended, raised = threading.Event(), []

    async def app(scope, receive, send):  # the app, and whether handling the request raised
        try:
            await inner(scope, receive, send)
        except BaseException as exc:
            raised.append(exc)
            raise
        finally:
            ended.set()

    running = Running(app, lifespan="off")
    try:
        with socket.create_connection(("127.0.0.1", running.port)) as sock:
            sock.sendall(_post_head("/v1/chat/completions", content_length="1000") + b'{"messages": [')
        assert ended.wait(60)  # a hang guard only
    finally:
        running.stop()
    err = capfd.readouterr().err
    assert raised == [] and "Traceback" not in err and "internal error" not in err, err


@pytest.mark.slow
def test_a_prompt_far_over_the_context_is_refused_without_tokenizing_it(client, served, monkeypatch):
    """A prompt of megabytes cannot fit the context; tokenizing it took seconds and gigabytes
    before the context check refused it."""
    import openai

    tok = served.service.tokenizer
    encoded: list[int] = []
    encode = tok.encode
    monkeypatch.setattr(tok, "encode", lambda text, *a, **kw: encoded.append(len(text)) or encode(text, *a, **kw))
    context = served.service.model.config.context_length
    for words in (800_000, 9000):  # far over: refused as it is; a little over: tokenized and counted
        with pytest.raises(openai.BadRequestError) as info:
            _ask(client, "word " * words)
        assert info.value.code == "context_length_exceeded" and info.value.body["param"] == "messages", info.value.body
        assert f"maximum context length is {context} tokens" in info.value.message
    assert encoded and max(encoded) < 1 << 20, encoded
