"""Replay, fork and diff of runs recorded by `tttr serve`: calls made with the official
`openai` client against a real server with `--db`, then replayed (faithful: no model),
forked at a token (regenerated from there with the call's own seed and sampling) and
diffed. A run in the proxied format (tokens without logits) is built with the Store API,
so its test needs neither an upstream nor a model."""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest

from tttr.engine.replay.diff import diff_runs
from tttr.engine.replay.calls import check_call_fork, check_call_replay
from tttr.engine.replay.policy import Policy
from tttr.engine.replay.result import ReplayError
from tttr.engine.replay.runtime import Runtime
from tttr.engine.replay.source import Source
from tttr.sessions.store import Store


# Served calls' own check and act (engine/replay/calls.py, the CALLS kind's), on one store.
def check_fork(store, run_id, site, value, *, runtime):
    return check_call_fork(Source(store, run_id), site, value, runtime=runtime)


def fork(store, run_id, site, value, *, runtime):
    return check_fork(store, run_id, site, value, runtime=runtime).act(store)


def replay(store, run_id, free=(), *, runtime):
    return check_call_replay(Source(store, run_id), Policy(frozenset(free)), runtime=runtime).act(store)


def _events(store, run_id, kind):
    return [e for e in store.events(run_id) if e.kind == kind]


def _token_ids(store, run_id, step=None):
    return [e.value["id"] for e in _events(store, run_id, "token") if step is None or e.step == step]


# ---------------------------------------------------------------------------- proxied format, no model
UPSTREAM = "http://127.0.0.1:9/v1"


def _proxied_run(store) -> int:
    """Two calls as `tttr serve --upstream` records them (engine/serve/recorder.py): no prompt
    ids, token events marked upstream and without logits, the upstream named in meta."""
    served_by = {"upstream": UPSTREAM, "model": "upstream-model", "system_fingerprint": "fp_x", "same_model": False}
    rid = store.begin_run(task="api:chat", model_id="upstream-model", kernel_mode=None,
                          sampling={"temperature": 0.0}, seed=5, fingerprint={"served_by": "upstream", **served_by},
                          meta={"source": "tttr serve", "name": None, "endpoint": "chat", "served_by": served_by,
                                "tensor": "not recorded"})
    for step, words in enumerate((["Hel", "lo", "!"], ["Bye", "."])):
        store.append(rid, f"{step}:prompt", {
            "endpoint": "chat", "request": {"messages": [{"role": "user", "content": f"call {step}"}]},
            "sent": {}, "sampling": {"temperature": 0.0, "seed": 5}, "seed_drawn": False, "response_id": "r",
            "upstream": UPSTREAM})
        for pos, w in enumerate(words):
            store.append(rid, f"{step}:token:{pos}",
                         {"id": 1000 + pos, "text": w, "forced": False, "logprob": -0.25, "rng": [5, 0, pos],
                          "upstream": True, "id_source": "vocab"})
        store.append(rid, f"{step}:message",
                     {"text": "".join(words), "finish_reason": "stop", "tool_calls": [], "upstream": True})
        store.commit_step(rid)
    store.finish_run(rid, "complete", {"calls": 2})
    return rid


def test_a_proxied_run_replays_from_the_recording_alone(tmp_path):
    runtime = Runtime()
    with Store.open(tmp_path / "p.db") as store:
        rid = _proxied_run(store)
        res = replay(store, rid, runtime=runtime)
        assert res.identical and res.logits_computed == 0 and res.divergence is None
        assert res.actions == ["Hello!", "Bye."] and res.calls == 2 and "calls" not in res.extra
        assert runtime._engine is None  # nothing loaded, nothing called
        child = store.run(res.run_id)
        assert child.parent == rid and child.status == "complete" and child.meta["served_by"]["upstream"] == UPSTREAM
        assert _token_ids(store, res.run_id) == _token_ids(store, rid)
        assert not _events(store, res.run_id, "logits")
        assert [e.value["text"] for e in _events(store, res.run_id, "message")] == ["Hello!", "Bye."]
        assert diff_runs(store, rid, res.run_id).identical
        # A fork regenerates from the token, which needs the upstream's model here: refused, nothing written.
        before = len(store.runs())
        with pytest.raises(ReplayError, match="proxied to http://127.0.0.1:9/v1"):
            check_fork(store, rid, "0:token:1", "42", runtime=runtime)
        with pytest.raises(ReplayError, match=r"only a token \(CALL:token:POS\) or a whole answer"):
            check_fork(store, rid, "0:clock", "+1h", runtime=runtime)
        assert len(store.runs()) == before


def test_a_served_run_still_recording_is_refused_saying_when_it_completes(tmp_path):
    with Store.open(tmp_path / "p.db") as store:
        rid = store.begin_run(task="demo", model_id="m", kernel_mode="invariant", sampling={}, seed=1,
                              meta={"source": "tttr serve", "name": "demo", "endpoint": "chat"})
        before = len(store.runs())
        with pytest.raises(ReplayError, match="X-TTTR-Run is complete once its `tttr serve` stops"):
            replay(store, rid, runtime=Runtime())
        assert len(store.runs()) == before


def test_the_commands_refuse_a_bad_site_in_one_line(tmp_path, capsys):
    from tttr.app.cli import main

    db = tmp_path / "p.db"
    with Store.open(db) as store:
        rid = _proxied_run(store)
    for at in ("0:clock", "0:token:99", "nosite", "0:token:1"):
        capsys.readouterr()
        assert main(["fork", str(rid), "--db", str(db), "--at", at, "--set", "42"]) == 2
        err = capsys.readouterr().err.strip()
        assert err and "\n" not in err and "Traceback" not in err, err
    assert main(["replay", str(rid), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert 'call 0: "Hello!"' in out and "tokens identical to the recording" in out and "logits computed: 0" in out


# ---------------------------------------------------------------------------- a real server
@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Calls recorded through a real server: run A is one chat call; run B two calls named
    `agent-b`; run P one call through a proxy (`--upstream`) in front of that server."""
    import openai

    from serve_helpers import Running
    from tttr.engine.serve.modes import Live, Proxied
    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.proxy import Upstream
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.engine.serve.service import Service

    folder = tmp_path_factory.mktemp("serve-replay")
    db = folder / "calls.db"
    service = Service(kernel_mode="invariant")
    recorder = CallRecorder(db, service)
    running = Running(create_app(Live(service), recorder))
    proxy_recorder = CallRecorder(folder / "proxy.db", None)
    proxy = Running(create_app(Proxied(Upstream(running.url + "/v1", key="unused")), proxy_recorder))
    try:
        assert service.wait_ready(300), service.load_error

        def ask(url, content, **kw):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            return client.chat.completions.create(messages=[{"role": "user", "content": content}], max_tokens=10,
                                                  temperature=0.8, seed=11, model=service.model_id, **kw)

        answer = ask(running.url, "Name a colour.")
        for content in ("Say hi.", "Count to three."):
            ask(running.url, content, extra_headers={"X-TTTR-Run": "agent-b"})
        proxied = ask(proxy.url, "Name a fruit.", logprobs=True)
    finally:
        proxy.stop()
        proxy_recorder.close()
        running.stop()
        recorder.close()  # finishes the named run
        service.close()
    with Store.open(db, readonly=True) as store:
        runs = {}
        for r in sorted(store.runs(), key=lambda r: r.id):  # the upstream recorded the proxied call too, last
            runs.setdefault(r.task, r.id)
    with Store.open(folder / "proxy.db", readonly=True) as store:
        (proxied_run,) = [r.id for r in store.runs()]
    return Recorded(db, runs["api:chat"], runs["agent-b"], answer.choices[0].message.content,
                    folder / "proxy.db", proxied_run, proxied.choices[0].message.content)


class Recorded(NamedTuple):
    db: object
    run_a: int
    run_b: int
    answer: str
    proxy_db: object
    proxied: int
    proxied_answer: str


@pytest.fixture(scope="module")
def runtime():
    rt = Runtime(kernel_mode="invariant")
    yield rt
    rt.close()


@pytest.mark.slow
def test_a_served_run_replays_faithfully_without_the_model(recorded):
    db, run_a, run_b, answer = recorded[:4]
    fresh = Runtime(kernel_mode="invariant")
    with Store.open(db) as store:
        for rid, calls in ((run_a, 1), (run_b, 2)):
            res = replay(store, rid, runtime=fresh)
            assert res.identical and res.divergence is None and res.logits_computed == 0 and res.calls == calls
            assert _token_ids(store, res.run_id) == _token_ids(store, rid)
            assert [e.value for e in _events(store, res.run_id, "logits")] == [e.value for e in _events(store, rid, "logits")]
            assert diff_runs(store, rid, res.run_id).identical
        assert fresh._engine is None  # no weights loaded
        assert replay(store, run_a, runtime=fresh).actions == [answer]


@pytest.mark.slow
def test_a_fork_regenerates_from_the_token(recorded, runtime):
    db, run_a = recorded.db, recorded.run_a
    with Store.open(db) as store:
        parent = _token_ids(store, run_a)
        assert len(parent) >= 4
        # Forced to its own recorded token, the rest regenerates exactly as the server answered:
        # same prompt ids, seed, sampling, RNG coordinates (seed, 0, P) and kernels.
        same = fork(store, run_a, "0:token:2", str(parent[2]), runtime=runtime)
        assert _token_ids(store, same.run_id) == parent and same.logits_computed == len(parent) - 3
        # Another token at position 2: the prefix is the parent's, the rest live, and reproducible.
        alt = next(i for i, _ in store.event_at(run_a, "0:logits:2").value["topk"] if i != parent[2])
        forks = [fork(store, run_a, "0:token:2", str(alt), runtime=runtime) for _ in range(2)]
        ids = [_token_ids(store, f.run_id) for f in forks]
        assert ids[0] == ids[1] and ids[0][:2] == parent[:2] and ids[0][2] == alt
        assert forks[0].logits_computed >= 1 and forks[0].actions == forks[1].actions
        child = store.run(forks[0].run_id)
        assert child.parent == run_a and child.fork_site == "0:token:2" and child.status == "complete"
        token = store.event_at(forks[0].run_id, "0:token:3")
        if token is not None:
            assert token.value["rng"] == [11, 0, 3]
        # The tensor layer freed: every call recomputed in the run's kernels, the same tokens and digests.
        freed = replay(store, run_a, free=("tensor",), runtime=runtime)
        assert freed.identical and freed.divergence is None and freed.logits_computed == len(parent)
        # A whole answer replaced: its tokens forced, ended by the model's end of turn, shown as given.
        whole = fork(store, run_a, "0:message", "It is Paris.", runtime=runtime)
        assert whole.actions == ["It is Paris."] and whole.logits_computed == 0
        tokens = [e.value for e in _events(store, whole.run_id, "token")]
        assert all(t["forced"] and t["mutated"] for t in tokens)
        assert tokens[-1]["id"] in runtime.tokenizer.stop_token_ids
        assert store.run(whole.run_id).fork_site == "0:message"
        d = diff_runs(store, run_a, forks[0].run_id)
        assert d.first_divergence["token"].site == "0:token:2"
        assert d.first_divergence["token"].a == parent[2] and d.first_divergence["token"].b == alt


@pytest.mark.slow
def test_the_commands_on_a_served_run(recorded, capsys):
    from tttr.app.cli import main

    db, run_a, run_b = recorded[:3]
    assert main(["replay", str(run_b), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "2 calls" in out and "call 1:" in out and "tokens identical to the recording" in out
    assert main(["fork", str(run_a), "--db", str(db), "--at", "0:token:1", "--set", "id:28"]) == 0
    out = capsys.readouterr().out
    assert "forked run" in out and f"child of {run_a}" in out and "call 0:" in out
    forked = int(out.split("forked run ")[1].split()[0])
    assert main(["replay", str(run_a), "--db", str(db), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["identical"] and got["calls"] == 1 and got["logits_computed"] == 0
    assert main(["diff", str(run_a), str(forked), "--db", str(db)]) == 0
    assert "first divergence: 0:token:1 (token layer)" in capsys.readouterr().out
    for at in ("0:tool", "5:token:0", "0:token:999"):
        assert main(["fork", str(run_a), "--db", str(db), "--at", at, "--set", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert err and "\n" not in err, err


@pytest.mark.slow
def test_a_call_recorded_through_a_proxy_replays_without_calling_anything(recorded):
    fresh = Runtime(kernel_mode="invariant")
    with Store.open(recorded.proxy_db) as store:
        rid = recorded.proxied
        assert _events(store, rid, "token") and not _events(store, rid, "logits")
        res = replay(store, rid, runtime=fresh)  # the upstream is stopped: nothing could answer
        assert res.identical and res.logits_computed == 0 and res.actions == [recorded.proxied_answer]
        assert _token_ids(store, res.run_id) == _token_ids(store, rid) and fresh._engine is None
        with pytest.raises(ReplayError, match="was proxied to http://127.0.0.1"):
            fork(store, rid, "0:token:1", "28", runtime=fresh)
