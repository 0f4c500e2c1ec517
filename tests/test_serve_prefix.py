"""Prefix reuse in `tttr serve`: under the invariant kernels a chat turn whose prompt extends an
earlier call's is not prefilled again, and its tokens and logits digests are those without
reuse. The slow test runs a real conversation through uvicorn with the official client and
the recorder, the default model, a few tokens a turn."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tttr.engine.errors import EngineError
from tttr.engine.serve.service import PREFIX_CACHE_ENV, PREFIX_CACHE_MB, Service, prefix_cache_size
from serve_helpers import Running

SYSTEM = "You answer questions about a small project's files in one short sentence. " * 8
QUESTIONS = ("Which file holds the logs?", "How big is it?", "Can I delete it?")


def test_the_cache_size_comes_from_the_argument_the_environment_or_the_default(monkeypatch):
    monkeypatch.delenv(PREFIX_CACHE_ENV, raising=False)
    assert prefix_cache_size() == PREFIX_CACHE_MB
    monkeypatch.setenv(PREFIX_CACHE_ENV, " 64 ")
    assert prefix_cache_size() == 64 and prefix_cache_size(0) == 0 and prefix_cache_size(8) == 8
    for bad in ("lots", "-1", "1.5", ""):
        monkeypatch.setenv(PREFIX_CACHE_ENV, bad)
        if bad == "":
            assert prefix_cache_size() == PREFIX_CACHE_MB  # empty is unset
            continue
        with pytest.raises(EngineError, match=PREFIX_CACHE_ENV):
            prefix_cache_size()
        with pytest.raises(EngineError, match=PREFIX_CACHE_ENV):
            Service()  # refused where it enters, before any model loads
    with pytest.raises(EngineError, match="prefix_cache_mb"):
        prefix_cache_size(True)
    monkeypatch.setenv(PREFIX_CACHE_ENV, "32")
    assert Service().prefix_cache_mb == 32
    assert Service(kernel_mode="fast", prefix_cache_mb=32).prefix_cache_mb == 0  # not prefix-invariant
    assert Service(kernel_mode="fast").prefix_stats() == {"enabled": False, "why": "fast kernels"}
    assert Service(kernel_mode="invariant-q8", prefix_cache_mb=32).prefix_cache_mb == 32  # invariant too
    loading = Service(prefix_cache_mb=32).prefix_stats()  # before the model (and its cache) load: on, empty
    assert loading["enabled"] is True and loading["max_mb"] == 32 and loading["entries"] == 0
    assert Service(prefix_cache_mb=0).prefix_stats() == {"enabled": False, "why": f"{PREFIX_CACHE_ENV}=0"}


def test_a_bad_size_stops_tttr_serve_in_one_line(monkeypatch, capsys):
    from tttr.app.cli import main

    monkeypatch.setenv(PREFIX_CACHE_ENV, "lots")
    assert main(["serve", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and PREFIX_CACHE_ENV in err[0] and "'lots'" in err[0], err


def _health(url: str) -> dict:
    with urllib.request.urlopen(url + "/health", timeout=30) as r:
        return json.loads(r.read())


def _converse(client, model: str, run: str) -> None:
    messages = [{"role": "system", "content": SYSTEM}]
    for i, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=5, temperature=0.8,
                                           seed=40 + i, extra_headers={"X-TTTR-Run": run})
        messages.append({"role": "assistant", "content": r.choices[0].message.content or ""})


def _recorded(store, task: str) -> list[tuple]:
    run = next(r for r in store.runs() if r.task == task)
    return [(e.site, e.value["id"] if e.kind == "token" else e.value["digest"])
            for e in store.events(run.id) if e.kind in ("token", "logits")]


@pytest.mark.slow
def test_a_conversation_served_with_prefix_reuse_is_the_same_as_without(tmp_path):
    import openai

    from tttr.engine.serve.modes import Live

    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.sessions.store import Store

    db = tmp_path / "calls.db"
    service = Service(kernel_mode="invariant", prefix_cache_mb=64)
    recorder = CallRecorder(db, service)
    running = Running(create_app(Live(service), recorder))
    try:
        assert service.wait_ready(300), service.load_error
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        cache = service.engine.prefixes
        assert cache is not None and cache.max_bytes == 64 << 20

        _converse(client, model, "with-reuse")
        health = _health(running.url)["prefix_cache"]
        # turns 2 and 3 start from the conversation so far: the system prompt and more
        assert health["enabled"] and health["hits"] >= 2 and health["reused_tokens"] > 2 * 60, health
        assert 0 < cache.bytes <= cache.max_bytes

        service.engine.prefixes = None  # the same conversation, every prompt prefilled whole
        _converse(client, model, "without-reuse")
        service.engine.prefixes = cache
        assert cache.hits == health["hits"]  # nothing was reused meanwhile
        recorder.flush()
        with Store.open(db, readonly=True) as store:
            reused, whole = _recorded(store, "with-reuse"), _recorded(store, "without-reuse")
        assert len(whole) >= 2 * len(QUESTIONS)
        assert reused == whole  # every turn's token ids and logits digests
    finally:
        running.stop()
