"""Types for what is stored (issue 28): `Store.append(run, site, value)` derives the event's
step, layer and kind from its site and stores the same bytes as the low-level
`Store.append_event(run, step, layer, kind, site, value)`; a site outside the grammar or a
kind outside the vocabulary is refused in one line naming the site."""

from __future__ import annotations

import sqlite3

import pytest

from tttr.sessions.store import Store, StoreError
from tttr.sessions.vocabulary import KIND_LAYER, site, site_parts

SEED = 7

# One of every kind of the vocabulary, at the setup step (both spellings), positions and steps.
EVENTS = [
    ("setup:clock", {"t": "2026-03-02T10:00:00"}),
    ("-1:setup", {"task": "t", "clock": "2026-03-02T10:00:00", "tree": "ab" * 32, "snapshot": None}),
    ("0:prompt", {"ids_digest": "cd" * 16, "n_tokens": 12}),
    ("0:token:0", {"id": 93, "text": " hi", "forced": False, "logprob": -0.5, "rng": [SEED, 0, 0]}),
    ("0:logits:0", {"digest": "ef" * 16, "topk": [[93, -0.5], [5, -1.25]], "batch": [2, [1]], "mode": "invariant"}),
    ("0:token:1", {"id": 94, "text": "\x1b[31m", "forced": True, "logprob": 0.1, "rng": [3, 9, 9]}),  # rng not the derived one: kept in the record
    ("0:token:2", {"rng": [SEED, 0, 2], "id": 1}),  # keys in another order: stored as JSON text
    ("0:message", {"text": "echo hi"}),
    ("0:action", {"cmd": "echo hi"}),
    ("0:clock", {"t": "2026-03-02T10:00:01"}),
    ("0:tool", {"cmd": "echo hi", "stdout": "hi\n", "stderr": "", "exit_code": 0}),
    ("1:token:10", {"id": 2, "text": "", "forced": False, "logprob": -0.25, "rng": [SEED, 1, 10]}),
    ("1:outcome", {"passed": True, "checker_exit": 0}),
]


def _rows(path) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return [conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in ("events", "steps", "kinds")]
    finally:
        conn.close()


def _record(path, write) -> None:
    with Store.open(path) as store:
        rid = store.begin_run(task="t", seed=SEED)
        step = None
        for at, value in EVENTS:
            s = site_parts(at)[0]
            if step is not None and s != step:
                store.commit_step(rid)
            step = s
            write(store, rid, at, value)
        store.finish_run(rid, "complete", {"passed": True})


def test_append_stores_the_same_rows_as_append_event(tmp_path):
    def old(store, rid, at, value):
        step, kind, _ = site_parts(at)
        return store.append_event(rid, step, KIND_LAYER[kind], kind, at, value)

    def new(store, rid, at, value):
        return store.append(rid, at, value)

    _record(tmp_path / "old.db", old)
    _record(tmp_path / "new.db", new)
    old_rows, new_rows = _rows(tmp_path / "old.db"), _rows(tmp_path / "new.db")
    assert old_rows == new_rows
    assert len(old_rows[0]) == len(EVENTS) and any(type(r[-1]) is bytes for r in old_rows[0])
    with Store.open(tmp_path / "new.db", readonly=True) as store:
        events = store.events(1)
    assert [(e.site, e.layer) for e in events] == [
        (site(*site_parts(at)), KIND_LAYER[site_parts(at)[1]]) for at, _ in EVENTS]
    assert [e.value for e in events] == [v for _, v in EVENTS]


def test_append_returns_dense_seqs_like_append_event(tmp_path):
    with Store.open(tmp_path / "s.db") as store:
        rid = store.begin_run(seed=SEED)
        assert store.append(rid, "0:clock", {"t": "2026-03-02T10:00:00"}) == 0
        assert store.append_event(rid, 0, "trace", "tool", "0:tool", {"cmd": "x"}) == 1
        assert store.append(rid, "0:token:0", {"id": 1}) == 2


@pytest.mark.parametrize("bad, said", [
    ("custom site", "is not STEP:KIND"),
    ("2:tool:x", "is not STEP:KIND"),
    ("02:tool", "is not STEP:KIND"),
    ("2:token:-1", "is not STEP:KIND"),
    ("2:sdk", "names the kind 'sdk'"),
    ("setup:file:a.txt", "is not STEP:KIND"),
    ("2:\x1b[31m", "names the kind"),
    ("2:tool\n3:tool", "is not STEP:KIND"),
    (7, "is not STEP:KIND"),
])
def test_append_refuses_a_site_it_cannot_derive_in_one_line_naming_it(tmp_path, bad, said):
    with Store.open(tmp_path / "s.db") as store:
        rid = store.begin_run(seed=SEED)
        with pytest.raises(StoreError, match=said) as err:
            store.append(rid, bad, {"x": 1})
        line = str(err.value)
        assert "\n" not in line and "\x1b" not in line and "site(step, kind, pos)" in line
        assert repr(str(bad)) in line
        store.commit_step(rid)
        assert store.count_events(rid) == 0  # nothing was buffered
        # the low-level form still writes such a row (foreign data) where its kind is a valid name
        if isinstance(bad, str) and bad.isprintable():
            store.append_event(rid, 0, "trace", "tool", bad, {"x": 1})
            store.commit_step(rid)
            assert store.event_at(rid, bad).value == {"x": 1}


@pytest.mark.parametrize("bad", ["0:token:05", "0:token:", "0:token:4:1", "0:token:-1", "0:token:٣", "0:token:4 "])
def test_a_position_after_a_stream_of_positions_is_still_checked(tmp_path, bad):
    """`append` reads the next position of a token stream without parsing its site again:
    what follows that prefix must still be a position as `site()` writes it."""
    with Store.open(tmp_path / "s.db") as store:
        rid = store.begin_run(seed=SEED)
        for pos in range(4):
            store.append(rid, f"0:token:{pos}", {"id": pos, "text": "", "forced": False, "logprob": 0.0,
                                                  "rng": [SEED, 0, pos]})
        with pytest.raises(StoreError, match="is not STEP:KIND"):
            store.append(rid, bad, {"x": 1})
        store.append(rid, "1:token:0", {"id": 9, "text": "", "forced": False, "logprob": 0.0, "rng": [SEED, 1, 0]})
        store.commit_step(rid)
        assert [(e.step, e.kind, e.site) for e in store.events(rid)][-2:] == [(0, "token", "0:token:3"),
                                                                              (1, "token", "1:token:0")]


def test_interleaved_streams_store_the_same_rows_as_append_event(tmp_path):
    """A served call appends its token and logits streams interleaved, step after step: each
    position is derived as its own stream's (the same rows as the six-argument form), and what
    follows a stream's `STEP:KIND:` is still checked."""
    events = []
    for step in (0, 1, 12):
        for pos in range(3):
            events += [(f"{step}:token:{pos}", {"id": pos, "text": "", "forced": False, "logprob": -1.0,
                                                "rng": [SEED, step, pos]}),
                       (f"{step}:logits:{pos}", {"digest": "ab" * 16, "topk": [[pos, -1.0]], "batch": [1, [0]],
                                                 "mode": "invariant"})]
        events.append((f"{step}:message", {"text": str(step)}))
    events.append(("1:token:3", {"id": 3}))  # an earlier step's stream again: still step 1

    def write(path, how):
        with Store.open(path) as store:
            rid = store.begin_run(task="t", seed=SEED)
            for at, value in events:
                how(store, rid, at, value)
                store.commit_step(rid)
            with pytest.raises(StoreError, match="is not STEP:KIND"):
                store.append(rid, "12:logits:01", {"x": 1})
            store.finish_run(rid, "complete", {"passed": True})

    write(tmp_path / "old.db", lambda store, rid, at, value: store.append_event(
        rid, site_parts(at)[0], KIND_LAYER[site_parts(at)[1]], site_parts(at)[1], at, value))
    write(tmp_path / "new.db", lambda store, rid, at, value: store.append(rid, at, value))
    assert _rows(tmp_path / "old.db") == _rows(tmp_path / "new.db")
    with Store.open(tmp_path / "new.db", readonly=True) as store:
        got = [(e.step, e.layer, e.kind, e.site) for e in store.events(1)]
    assert got == [(site_parts(at)[0], KIND_LAYER[site_parts(at)[1]], site_parts(at)[1], at) for at, _ in events]


# ---------------------------------------------------------------------------- the token value
def test_token_value_is_the_contract_record_codec_stores_binary():
    from tttr.sessions import codec
    from tttr.sessions.records import token_value

    value = token_value(93, " hi", False, -0.5, (SEED, 2, 3))
    assert value == {"id": 93, "text": " hi", "forced": False, "logprob": -0.5, "rng": [SEED, 2, 3]}
    assert tuple(value) == codec.TOKEN_KEYS
    stored = codec.encode("token", value, SEED, 2, 3)
    assert type(stored) is bytes and stored == codec.encode("token", dict(value), SEED, 2, 3)
    assert codec.decode(stored, SEED, 2, 3) == value


def test_a_mutated_or_proxied_token_keeps_its_key_order_and_is_stored_as_json():
    from tttr.sessions import codec
    from tttr.sessions.records import token_value

    mutated = token_value(7, " x", True, -1.25, [1, 0, 0], mutated=True)
    assert list(mutated) == ["id", "text", "forced", "mutated", "logprob", "rng"]
    proxied = token_value(0, "hi", False, None, [1, 0, 4], upstream=True, id_source="none")
    assert list(proxied) == [*codec.TOKEN_KEYS, "upstream", "id_source"] and proxied["logprob"] is None
    for v in (mutated, proxied):
        assert codec.encode("token", v, 1, 0, 0) == codec._json(v)


def test_the_engines_token_record_gives_the_same_value():
    from tttr.engine.inference.sequence import TokenRecord
    from tttr.sessions.records import token_value

    r = TokenRecord(position=3, token_id=93, forced=True, logprob=-0.25, topk=((93, -0.25),), digest="ab" * 16,
                    batch_rows=1, rows=(0,), row=0, kernel_mode="invariant", rng=(SEED, 2, 3), text=" hi")
    assert r.token_value() == token_value(93, " hi", True, -0.25, [SEED, 2, 3])
    assert list(r.token_value()) == list(token_value(93, " hi", True, -0.25, [SEED, 2, 3]))


# ---------------------------------------------------------------------------- the outcome
def test_a_runs_outcome_is_an_outcome_read_and_written_at_the_store(tmp_path):
    from tttr.sessions.records import Outcome

    stored = {"reason": "cancelled", "passed": False, "checker_exit": 1, "checker_output": "no\n", "exit_code": 3}
    with Store.open(tmp_path / "s.db") as store:
        a = store.begin_run(seed=SEED)
        store.finish_run(a, "complete", stored)
        b = store.begin_run(seed=SEED)
        store.finish_run(b, "incomplete", Outcome.of({"reason": "recording stopped early"}))
        c = store.begin_run(seed=SEED)
        store.finish_run(c, "complete")
        runs = {r.id: r for r in store.runs()}
    got = runs[a].outcome
    assert isinstance(got, Outcome) and got == stored and runs[a].problem is None
    assert (got.passed, got.reason, got.checker_exit, got.checker_output) == (False, "cancelled", 1, "no\n")
    assert got["exit_code"] == 3 and got.get("finish_reason") is None
    assert list(got.to_json()) == list(stored)  # the stored order: what --json prints is unchanged
    assert runs[b].outcome.reason == "recording stopped early" and runs[b].outcome.passed is None
    assert runs[c].outcome is None
    assert runs[a].to_json()["outcome"] == stored and type(runs[a].to_json()["outcome"]) is dict
    conn = sqlite3.connect(tmp_path / "s.db")
    assert conn.execute("SELECT outcome FROM runs WHERE id = ?", (b,)).fetchone()[0] == '{"reason":"recording stopped early"}'
    conn.close()


@pytest.mark.parametrize("column, problem, fields", [
    ('[1, 2]', "its outcome is a list, not an object", None),
    ('"passed"', "its outcome is text, not an object", None),
    ('{"passed": "yes", "exit_code": 0}', "its outcome field 'passed' is text, not a boolean", {"exit_code": 0}),
    ('{"checker_exit": 1.5, "reason": 7}', "its outcome field 'reason' is an integer, not text", {}),
])
def test_an_outcome_of_the_wrong_type_is_the_runs_problem(tmp_path, column, problem, fields):
    with Store.open(tmp_path / "s.db") as store:
        rid = store.begin_run(seed=SEED)
        store.finish_run(rid, "complete")
    conn = sqlite3.connect(tmp_path / "s.db")
    conn.execute("UPDATE runs SET outcome = ? WHERE id = ?", (column, rid))
    conn.commit()
    conn.close()
    with Store.open(tmp_path / "s.db", readonly=True) as store:
        run = store.run(rid)
    assert problem in run.problem
    assert (None if run.outcome is None else run.outcome.to_json()) == fields
    assert run.outcome is None or run.outcome.passed is None


# ---------------------------------------------------------------------------- the run's kind
@pytest.mark.parametrize("task, meta, kind", [
    ("write-line", {}, "agent"),
    ("write-line", {"replay": {"free": ["token"]}}, "agent"),
    ("api:chat", {}, "calls"),
    (None, {"source": "tttr serve", "endpoint": "chat"}, "calls"),
    (None, {"source": "tttr serve (proxy)"}, "calls"),
    ("x", {"upstream": "http://h"}, "calls"),
    ("program:agent.py", {}, "program"),
    ("mine", {"source": "tttr record", "program": ["python3", "a.py"]}, "program"),
    ("trace:AgentExecutor", {"source": "tttr import"}, "imported"),
    (["not", "text"], {"source": 7}, "agent"),  # a hostile row: the agent's, by default
])
def test_a_runs_kind_is_named_once_in_its_meta_and_kind_of_reads_it(tmp_path, task, meta, kind):
    from tttr.engine.kinds import kind_of
    from tttr.sessions.records import RUN_KINDS, RunMeta

    with Store.open(tmp_path / "s.db") as store:
        rid = store.begin_run(task=task if isinstance(task, str) else None, meta=meta, seed=SEED)
        store.finish_run(rid)
        run = store.run(rid)
    if isinstance(task, str):
        assert run.meta == RunMeta.of(task, meta) == meta and run.meta.kind == kind
        assert kind_of(run).name == kind
    assert RunMeta.of(task, meta).kind == kind and kind in RUN_KINDS
    with pytest.raises(ValueError, match="one of agent, calls, program, imported"):
        RunMeta("shell")


@pytest.mark.parametrize("text, parts", [
    ("2:tool", (2, "tool", None)), ("setup:clock", (-1, "clock", None)), ("-1:clock", (-1, "clock", None)),
    ("12:token:0", (12, "token", 0)), ("0:logits:105", (0, "logits", 105)),
    ("02:tool", None), ("+2:tool", None), (" 2:tool", None), ("2:token:01", None), ("2:token:-1", None),
    ("2:token: 1", None), ("1_0:tool", None), ("\u0661:tool", None), ("-0:tool", None), ("2:", None), ("2", None),
    ("2:token:1:1", None), ("setup:token:1_0", None),
])
def test_site_parts_reads_exactly_what_site_writes(text, parts):
    assert site_parts(text) == parts
    if parts is not None:
        assert site(*parts) == ("setup:" + text[3:] if text.startswith("-1:") else text)
