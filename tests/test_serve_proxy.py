"""`tttr serve --upstream`: a proxy that forwards OpenAI calls to another server and records
them at the token layer. The upstream is a second `tttr serve` (in this process); the tests
marked slow run the default model."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tttr.engine.serve.proxy import Plan, ProxiedCall, Upstream, base_url, for_client, shown_url
from serve_helpers import Running, free_port

USER = [{"role": "user", "content": "Name a colour."}]


def _http(url: str, data: bytes | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


# ---------------------------------------------------------------------------- no model
def test_the_upstream_url_and_what_is_sent():
    assert base_url("http://h:8001") == "http://h:8001/v1" and base_url("http://h:8001/v1/") == "http://h:8001/v1"
    assert shown_url("https://user:secret@api.example.com/v1") == "https://api.example.com/v1"
    up = Upstream("http://127.0.0.1:9/v1", key="sk-secret")
    assert "sk-secret" not in repr(up)
    plan = up.plan("chat", {"messages": USER, "stream": True})
    assert plan.seed_drawn and plan.sent["seed"] == plan.seed and "seed" not in plan.request
    assert plan.sent["logprobs"] is True and plan.sent["stream_options"] == {"include_usage": True}
    chunk = {"choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": {"content": []}}], "usage": None}
    shown = for_client(plan, chunk)
    assert shown["choices"][0]["logprobs"] is None and "usage" not in shown and shown["tttr"]["seed"] == plan.seed
    assert up.plan("completion", {"prompt": "x", "seed": 4}).sent["logprobs"] == 5


def test_a_streamed_answer_is_assembled_for_the_record():
    plan = Plan("chat", {}, {}, seed=3, seed_drawn=False, stream=True, client_logprobs=False, client_usage=False)
    call = ProxiedCall(plan, None, upstream=None)
    for i, piece in enumerate(["Bl", "ue"]):
        call.add_chunk({"id": "c1", "model": "m", "system_fingerprint": "fp", "choices": [{
            "index": 0, "delta": {"content": piece}, "finish_reason": "stop" if i else None,
            "logprobs": {"content": [{"token": piece, "logprob": -0.5, "bytes": list(piece.encode()),
                                      "top_logprobs": [{"token": piece, "logprob": -0.5}]}]}}]})
    call.add_chunk({"id": "c1", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}})
    assert (call.text, call.finish_reason, call.model, call.system_fingerprint) == ("Blue", "stop", "m", "fp")
    assert [t.text for t in call.tokens] == ["Bl", "ue"] and call.usage["prompt_tokens"] == 7
    call.add_chunk({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "t", "function": {"name": "f", "arguments": "{\"a\""}}]}}]})
    call.add_chunk({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}}]})
    assert call.tool_calls == [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]


def test_an_unreachable_upstream_is_a_502():
    from tttr.engine.serve.modes import Proxied
    from tttr.engine.serve.server import create_app

    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    running = Running(create_app(Proxied(Upstream(dead))), lifespan="off")
    try:
        status, got = _http(running.url + "/v1/chat/completions", json.dumps({"messages": USER}).encode())
        assert status == 502 and set(got["error"]) == {"message", "type", "param", "code"}, got
        assert got["error"]["code"] == "upstream_unreachable" and "127.0.0.1" in got["error"]["message"]
        assert _http(running.url + "/v1/models")[0] == 502
        status, got = _http(running.url + "/v1/chat/completions", b"{nope")
        assert status == 400 and got["error"]["code"] == "invalid_json"
        assert _http(running.url + "/health") == (200, {"status": "ok", "mode": "proxy", "upstream": dead})
    finally:
        running.stop()


# ---------------------------------------------------------------------------- the model
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tttr serve (recording to up.db) and a proxy in front of it (recording to proxy.db)."""
    from tttr.engine.serve.modes import Live, Proxied
    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.engine.serve.service import Service

    folder = tmp_path_factory.mktemp("proxy")
    service = Service(kernel_mode="invariant")
    up_recorder = CallRecorder(folder / "up.db", service)
    upstream = Running(create_app(Live(service), up_recorder))
    assert service.wait_ready(300), service.load_error
    proxy_recorder = CallRecorder(folder / "proxy.db", None)
    target = Upstream(upstream.url + "/v1", key="sk-never-recorded")
    proxied = Running(create_app(Proxied(target), proxy_recorder))
    yield {"up": upstream, "proxy": proxied, "service": service, "up_db": folder / "up.db", "db": folder / "proxy.db",
           "up_recorder": up_recorder, "recorder": proxy_recorder, "target": target}
    proxied.stop()
    upstream.stop()


def _client(url: str):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _ask(client, **kw):
    kw = {"max_tokens": 8, "temperature": 0.8, "seed": 21, "messages": USER, **kw}
    return client.chat.completions.create(model=kw.pop("model", None) or client.models.list().data[0].id, **kw)


@pytest.mark.slow
def test_the_proxy_answers_as_the_upstream_does(pair):
    direct = _ask(_client(pair["up"].url), logprobs=True, top_logprobs=2)
    via = _ask(_client(pair["proxy"].url), logprobs=True, top_logprobs=2)
    assert via.choices[0].message.content == direct.choices[0].message.content
    assert via.system_fingerprint == direct.system_fingerprint and via.model == direct.model
    assert [(e.token, e.logprob) for e in via.choices[0].logprobs.content] == \
        [(e.token, e.logprob) for e in direct.choices[0].logprobs.content]
    plain = _ask(_client(pair["proxy"].url))
    assert plain.choices[0].logprobs is None  # asked upstream for the record, not shown
    assert plain.choices[0].message.content == direct.choices[0].message.content
    import openai

    with pytest.raises(openai.BadRequestError, match="n=2"):  # the upstream's 400, passed through
        _ask(_client(pair["proxy"].url), n=2)


@pytest.mark.slow
def test_streaming_through_the_proxy(pair):
    direct = _ask(_client(pair["up"].url)).choices[0].message.content
    chunks = list(_ask(_client(pair["proxy"].url), stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == direct
    assert all(c.choices for c in chunks)  # the usage chunk the proxy asked for is not passed on
    with_usage = list(_ask(_client(pair["proxy"].url), stream=True, stream_options={"include_usage": True}))
    assert with_usage[-1].usage.completion_tokens >= 1


@pytest.mark.slow
def test_a_responses_call_through_the_proxy_goes_upstream_as_its_chat_call(pair):
    direct = _ask(_client(pair["up"].url)).choices[0].message.content
    proxy = _client(pair["proxy"].url)
    model = proxy.models.list().data[0].id
    asked = dict(model=model, input=USER[0]["content"], temperature=0.8, max_output_tokens=8, extra_body={"seed": 21})
    assert proxy.responses.create(**asked).output_text == direct
    streamed = list(proxy.responses.create(stream=True, **asked))
    assert "".join(e.delta for e in streamed if e.type == "response.output_text.delta") == direct
    assert streamed[-1].response.output_text == direct and streamed[-1].response.usage.output_tokens >= 1


@pytest.mark.slow
def test_a_proxied_call_is_recorded_at_the_token_layer(pair):
    from tttr.sessions.store import Store

    answer = _ask(_client(pair["proxy"].url), seed=33, extra_headers={"X-TTTR-Run": "proxied"})
    pair["recorder"].flush()
    pair["up_recorder"].flush()
    with Store.open(pair["db"], readonly=True) as store:
        run = next(r for r in store.runs() if r.task == "proxied")
        events = list(store.events(run.id))
    kinds = {e.kind for e in events}
    assert "logits" not in kinds and {"prompt", "token", "message"} <= kinds
    assert run.meta["tensor"] == "not recorded" and run.meta["served_by"]["upstream"] == pair["target"].url
    assert run.fingerprint["upstream"] == pair["target"].url and run.model_id == answer.model
    assert run.meta["served_by"]["system_fingerprint"] == answer.system_fingerprint and run.seed == 33
    tokens = [e.value for e in events if e.kind == "token"]
    message = next(e.value for e in events if e.kind == "message")
    assert message["text"] == answer.choices[0].message.content and message["model"] == answer.model
    assert all(t["upstream"] and t["logprob"] is not None and t["rng"] == [33, 0, i] for i, t in enumerate(tokens))
    assert "sk-never-recorded" not in json.dumps([e.value for e in events]) + json.dumps(run.meta.to_json())
    # the upstream serves the same model: the ids are the ones it generated (its own record)
    with Store.open(pair["up_db"], readonly=True) as store:
        up_run = [r for r in store.runs() if r.seed == 33][-1]
        up_ids = [e.value["id"] for e in store.events(up_run.id) if e.kind == "token"]
    stop_ids = set(pair["service"].tokenizer.stop_token_ids)
    assert [t["id"] for t in tokens] == [i for i in up_ids if i not in stop_ids]
    assert all(t["id_source"] == "vocab" for t in tokens)


def test_tttr_prompt_of_a_proxied_run_says_it_recorded_no_prompt_ids(pair, capsys):
    """Its calls keep their request, not the ids: each step says so (it was 'unknown task api:chat')."""
    from tttr.app.cli import main
    from tttr.sessions.store import Store

    _ask(_client(pair["proxy"].url), seed=34, extra_headers={"X-TTTR-Run": "proxied-prompt"})
    pair["recorder"].flush()
    with Store.open(pair["db"], readonly=True) as store:
        run = next(r for r in store.runs() if r.task == "proxied-prompt")
    capsys.readouterr()
    assert main(["prompt", str(pair["db"]), str(run.id), "--json"]) == 0
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert steps and all(not s["verified"] and "no prompt ids (a proxied call)" in s["note"] for s in steps)


def test_the_serve_command_in_proxy_mode_refuses_a_missing_key(tmp_path, monkeypatch):
    from tttr.app.cli import main

    monkeypatch.delenv("TTTR_TEST_NO_KEY", raising=False)
    assert main(["serve", "--upstream", "http://127.0.0.1:9/v1", "--upstream-key-env", "TTTR_TEST_NO_KEY"]) == 2


def test_the_serve_command_refuses_any_model_in_proxy_mode(capsys):
    from tttr.app.cli import main

    assert main(["serve", "--upstream", "http://127.0.0.1:9/v1", "--any-model"]) == 2
    assert "in proxy mode the upstream decides" in capsys.readouterr().err
