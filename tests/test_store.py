"""The session store: round trips, windows, sites, forks, blobs, migrations, liveness."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tttr.sessions import codec, schema
from tttr.sessions.store import Event, Store, StoreError
from tttr.sessions.vocabulary import canonical_site

SEED = 41
ROOT = Path(__file__).resolve().parent.parent


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def token(step: int, pos: int, tid: int = 7, seed: int = SEED) -> dict:
    return {"id": tid, "text": f" t{tid}", "forced": pos % 3 == 0, "logprob": f32(-0.1 * pos), "rng": [seed, step, pos]}


def logits(pos: int) -> dict:
    return {"digest": hashlib.sha256(str(pos).encode()).hexdigest(), "topk": [[pos, -0.25], [pos + 1, -1.5]],
            "batch": [4, [pos % 4]], "mode": "invariant"}


def record(store: Store, steps: int = 4, positions: int = 5, **run) -> int:
    """A run of `steps` steps: clock, positions x (logits, token), action, tool."""
    rid = store.begin_run(task="t", model_id="m", kernel_mode="invariant", seed=SEED, **run)
    for s in range(steps):
        record_step(store, rid, s, positions)
    store.finish_run(rid, "complete", {"passed": True})
    return rid


def record_step(store: Store, rid: int, s: int, positions: int = 5) -> None:
    store.append(rid, f"{s}:clock", {"t": f"2026-11-29T10:0{s % 10}:00"})
    for p in range(positions):
        store.append(rid, f"{s}:logits:{p}", logits(p))
        store.append(rid, f"{s}:token:{p}", token(s, p, tid=100 * s + p))
    store.append(rid, f"{s}:action", {"cmd": f"echo {s}"})
    store.append(rid, f"{s}:tool", {"cmd": f"echo {s}", "stdout": f"{s}\n", "exit_code": 0})
    store.commit_step(rid)


@pytest.fixture
def db(tmp_path):
    with Store.open(tmp_path / "s.db") as store:
        yield store


# --------------------------------------------------------------------------- values
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
token_values = st.fixed_dictionaries({
    "id": st.integers(0, 2**40), "text": st.text(), "forced": st.booleans(),
    "logprob": st.floats(allow_nan=False) | st.floats(width=32, allow_nan=False),
    "rng": st.lists(st.integers(-(2**64), 2**64), min_size=3, max_size=3),
})
logits_values = st.fixed_dictionaries({
    "digest": st.binary(max_size=40).map(bytes.hex) | st.text(max_size=6),
    "topk": st.lists(st.tuples(st.integers(0, 2**33), st.floats(width=32, allow_nan=False) | st.floats(allow_nan=False)).map(list), max_size=6),
    "batch": st.tuples(st.integers(0, 70000), st.lists(st.integers(0, 70000), max_size=3)).map(list),
    "mode": st.sampled_from(["fast", "invariant", "invariant-q8", "other"]),
})


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["token", "logits", "tool"]), value=json_values | token_values | logits_values,
       seed=st.none() | st.integers(0, 9), step=st.integers(-1, 3), pos=st.none() | st.integers(0, 3))
def test_every_json_value_round_trips(kind, value, seed, step, pos):
    stored = codec.encode(kind, value, seed, step, pos)
    assert codec.decode(stored, seed, step, pos) == json.loads(json.dumps(value))


def test_token_and_logits_values_are_stored_as_small_records():
    t = codec.encode("token", token(3, 17), SEED, 3, 17)
    assert isinstance(t, bytes) and len(t) == 10 + len(" t7")  # tag, flags, id, f32 logprob, text; rng derived
    assert codec.decode(t, SEED, 3, 17) == token(3, 17)
    other_seed = codec.encode("token", token(3, 17, seed=5), SEED, 3, 17)
    assert len(other_seed) == len(t) + 24 and codec.decode(other_seed, SEED, 3, 17)["rng"] == [5, 3, 17]
    assert isinstance(codec.encode("logits", logits(2), SEED, 3, 2), bytes)
    for mode in ("fast", "invariant", "invariant-q8"):  # each kernel mode's records are compact and keep their mode
        compact = codec.encode("logits", {**logits(2), "mode": mode}, SEED, 3, 2)
        assert isinstance(compact, bytes) and codec.decode(compact, SEED, 3, 2)["mode"] == mode
    reordered = {"text": " a", "id": 1, "forced": False, "logprob": -1.0, "rng": [SEED, 3, 2]}
    assert isinstance(codec.encode("token", reordered, SEED, 3, 2), str)  # JSON keeps its key order


@pytest.mark.parametrize("site,step,kind,stored", [
    ("4:token:17", 4, "token", (17, None)), ("4:clock", 4, "clock", (None, None)), ("setup:setup", -1, "setup", (None, None)),
    ("4:token:017", 4, "token", (None, "4:token:017")), ("5:token:1", 4, "token", (None, "5:token:1")),
    ("4:clock", 4, "tool", (None, "4:clock")), ("anything", 0, "x", (None, "anything")), ("4:token:٣", 4, "token", (None, "4:token:٣")),
])
def test_sites_are_derived_when_canonical_and_kept_verbatim_otherwise(site, step, kind, stored):
    assert codec.split_site(site, step, kind) == stored
    assert codec.join_site(step, kind, *stored) == site


# --------------------------------------------------------------------------- round trips and windows
def test_run_and_events_round_trip(db):
    rid = record(db, sampling={"temperature": 0.7}, fingerprint={"torch": "2.13"}, meta={"note": "x"})
    run = db.run(rid)
    assert (run.status, run.outcome, run.seed, run.sampling, run.fingerprint, run.meta) == (
        "complete", {"passed": True}, SEED, {"temperature": 0.7}, {"torch": "2.13"}, {"note": "x"})
    events = db.events(rid)
    assert [e.seq for e in events] == list(range(4 * 13)) == list(range(db.count_events(rid)))
    assert db.steps(rid) == 4
    e = events[2]
    assert e == Event(rid, 2, 0, "token", "token", "0:token:0", token(0, 0, tid=0), rid)
    assert events[-1].value == {"cmd": "echo 3", "stdout": "3\n", "exit_code": 0}


def test_windows_filters_and_steps(db):
    rid = record(db, steps=6)
    assert [e.seq for e in db.events(rid, 20, 25)] == [20, 21, 22, 23, 24]
    assert [e.seq for e in db.events(rid, 20, None, limit=3)] == [20, 21, 22]
    step2 = db.events(rid, step=2)
    assert {e.step for e in step2} == {2} and len(step2) == 13 and step2[0].site == "2:clock"
    assert [e.site for e in db.events(rid, step=2, kind="token", limit=2)] == ["2:token:0", "2:token:1"]
    assert all(e.layer == "trace" for e in db.events(rid, layer="trace")) and len(db.events(rid, layer="trace")) == 12
    assert db.events(rid, kind="no-such-kind") == [] and db.events(rid, step=99) == []
    assert db.events(rid, 10**6, None) == []
    with pytest.raises(StoreError, match="unknown layer"):
        db.events(rid, layer="tensors")


def test_site_lookup(db):
    rid = record(db)
    assert db.event_at(rid, "2:token:3").value == token(2, 3, tid=203)
    assert db.event_at(rid, "3:tool").value["cmd"] == "echo 3"
    assert db.event_at(rid, "2:token:99") is None and db.event_at(rid, "nonsense") is None
    other = db.begin_run(seed=SEED)
    db.append_event(other, 0, "trace", "tool", "custom site", {"x": 1})
    db.commit_step(other)
    assert db.event_at(other, "custom site").value == {"x": 1}


def test_uncommitted_events_are_not_visible_and_seqs_stay_dense(db):
    rid = db.begin_run(seed=SEED)
    assert db.append(rid, "0:clock", {"t": "2026-11-29T10:00:00"}) == 0
    assert db.count_events(rid) == 0 and db.events(rid) == []
    db.commit_step(rid)
    assert db.count_events(rid) == 1 and db.run(rid).status == "recording"


def test_bad_writes_are_refused(db):
    rid = db.begin_run()
    with pytest.raises(StoreError, match="unknown layer"):
        db.append_event(rid, 0, "kernel", "x", "0:x", 1)
    with pytest.raises(StoreError, match="not JSON"):
        db.append(rid, "0:tool", {"f": object()})
    with pytest.raises(StoreError, match="not being recorded"):
        db.append(rid + 1, "0:tool", {})
    with pytest.raises(StoreError, match="final status"):
        db.finish_run(rid, "done")
    with pytest.raises(StoreError, match="no run 99"):
        db.run(99)


# --------------------------------------------------------------------------- forks
def test_fork_reads_parent_prefix_then_its_own_events_without_copying(db):
    parent = record(db, steps=4)
    rows_before = db._conn.execute("SELECT count(*) FROM events").fetchone()[0]
    fork_at = db.event_at(parent, "2:token:3").seq
    child = db.begin_run(parent=parent, fork_site="2:token:3", mutation={"site": "2:token:3", "value": "x"}, seed=SEED)
    assert db.run(child).fork_seq == fork_at
    assert db._conn.execute("SELECT count(*) FROM events").fetchone()[0] == rows_before  # O(1): nothing copied
    assert db.count_events(child) == fork_at
    db.append(child, "2:token:3", token(2, 3, tid=999))
    db.append(child, "2:token:4", token(2, 4, tid=998))
    db.commit_step(child)
    record_step(db, child, 3, positions=1)
    events = db.events(child)
    assert [e.seq for e in events] == list(range(len(events)))
    assert [e.site for e in events[:fork_at]] == [e.site for e in db.events(parent, 0, fork_at)]
    assert {e.origin for e in events[:fork_at]} == {parent} and {e.origin for e in events[fork_at:]} == {child}
    assert all(e.run == child for e in events)
    assert db.event_at(child, "2:token:3").value["id"] == 999  # the mutation, not the parent's token
    assert db.event_at(child, "1:tool").origin == parent
    assert db.event_at(child, "2:tool") is None  # after the fork point in the parent: not the child's
    assert [e.seq for e in db.events(child, fork_at - 2, fork_at + 2)] == list(range(fork_at - 2, fork_at + 2))
    assert [e.site for e in db.events(child, step=2, kind="token")] == [f"2:token:{p}" for p in range(5)]
    assert db.steps(child) == 4 and db.count_events(child) == len(events)
    # A fork of the fork resolves through both.
    grandchild = db.begin_run(parent=child, fork_seq=fork_at + 1, seed=SEED)
    assert [e.origin for e in db.events(grandchild)][fork_at - 1 : fork_at + 2] == [parent, child]
    assert db.count_events(grandchild) == fork_at + 1
    # A replay child shares nothing.
    replay = db.begin_run(parent=parent, fork_seq=0, meta={"replay": {"free": ["tensor"]}})
    assert db.events(replay) == [] and db.count_events(replay) == 0


def test_raw_events_read_a_fork_as_events_does_and_peek_reads_ids_and_digests(db):
    from tttr.sessions import codec

    parent = record(db, steps=3)
    fork_at = db.event_at(parent, "1:token:2").seq
    child = db.begin_run(parent=parent, fork_site="1:token:2", mutation={"site": "1:token:2", "value": "x"}, seed=SEED)
    db.append(child, "1:token:2", token(1, 2, tid=777))
    db.commit_step(child)
    assert db.sources(child) == [parent, child] and db.sources(parent) == [parent]
    raw = [r for rows in db.raw_events(child, batch=3) for r in rows]  # several batches, across the fork
    assert [db.decode_raw(child, r) for r in raw] == db.events(child)
    assert [r.source for r in raw] == [parent] * fork_at + [child]
    peeked = [(r.kind, codec.peek(r.value)) for r in raw if r.kind in ("token", "logits")]
    events = {e.site: e.value for e in db.events(child)}
    for (kind, got), r in zip(peeked, [r for r in raw if r.kind in ("token", "logits")]):
        want = events[f"{r.step}:{kind}:{r.pos}"]
        assert got == (kind, want["id"] if kind == "token" else want["digest"])
    assert peeked[-1] == ("token", ("token", 777))
    assert codec.peek('{"id": 1}') is None and codec.peek(b"\x01") is None and codec.peek(b"\x09abcdefghij") is None


def test_fork_arguments_are_checked(db):
    parent = record(db, steps=1)
    with pytest.raises(StoreError, match="outside run"):
        db.begin_run(parent=parent, fork_seq=10**6)
    with pytest.raises(StoreError, match="not in run"):
        db.begin_run(parent=parent, fork_site="9:token:0")
    with pytest.raises(StoreError, match="need a parent"):
        db.begin_run(fork_seq=3)
    with pytest.raises(StoreError, match="no run 77"):
        db.begin_run(parent=77, fork_seq=0)


# --------------------------------------------------------------------------- blobs
def test_blobs_are_content_addressed_compressed_and_stored_once(db):
    data = b"line of tool output\n" * 500
    digest = db.put_blob(data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert db.put_blob(data) == digest and db.get_blob(digest) == data and db.has_blob(digest)
    count, stored = db._conn.execute("SELECT count(*), sum(length(data)) FROM blobs").fetchone()
    assert count == 1 and stored < len(data) / 10
    noise = bytes(range(256)) * 2
    assert db.get_blob(db.put_blob(noise)) == noise
    assert not db.has_blob("0" * 64)
    with pytest.raises(StoreError, match="no blob"):
        db.get_blob("0" * 64)


# --------------------------------------------------------------------------- schema and migrations
def build_v1(path) -> None:
    """A database as tttr's first schema wrote it: no steps table."""
    conn = sqlite3.connect(path, isolation_level=None)
    schema.migrate(conn, upto=1)
    conn.execute("INSERT INTO runs (id, task, sampling, seed, fingerprint, status, created, meta) "
                 "VALUES (1, 'old', '{}', 41, '{}', 'complete', '2026-01-01T00:00:00+00:00', '{}')")
    conn.execute("INSERT INTO kinds (code, layer, kind) VALUES (1, 'token', 'token'), (2, 'trace', 'tool')")
    for seq in range(6):
        step = seq // 3
        if seq % 3 == 2:
            row = (1 << 32 | seq, step, 2, None, None, json.dumps({"cmd": f"ls {step}"}))
        else:
            row = (1 << 32 | seq, step, 1, seq % 3, None, codec.encode("token", token(step, seq % 3), SEED, step, seq % 3))
        conn.execute("INSERT INTO events VALUES (?,?,?,?,?,?)", row)
    conn.close()


def test_migrates_a_version_1_database_on_open(tmp_path):
    path = tmp_path / "v1.db"
    build_v1(path)
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 1
    with Store.open(path) as store:
        assert store.file_version == 1
        assert [e.site for e in store.events(1, step=1)] == ["1:token:0", "1:token:1", "1:tool"]
        assert store.event_at(1, "0:token:1").value == token(0, 1) and store.steps(1) == 2
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
    assert conn.execute("SELECT * FROM steps").fetchall() == [(1, 0, 0, 2, 3), (1, 1, 3, 5, 3)]


def test_read_only_open_of_an_old_database_reads_it_and_leaves_it_untouched(tmp_path):
    path = tmp_path / "v1.db"
    build_v1(path)
    before = path.read_bytes()
    with Store.open(path, readonly=True) as store:
        assert store.runs()[0].task == "old" and len(store.events(1, step=0)) == 3
        with pytest.raises(StoreError, match="read-only"):
            store.begin_run()
    assert path.read_bytes() == before


def test_schema_is_wal_with_version_and_application_id(tmp_path):
    Store.open(tmp_path / "n.db").close()
    conn = sqlite3.connect(tmp_path / "n.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
    assert conn.execute("PRAGMA application_id").fetchone()[0] == schema.APPLICATION_ID
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


# --------------------------------------------------------------------------- liveness
def test_a_run_left_recording_by_a_dead_process_reads_incomplete(tmp_path):
    path = tmp_path / "d.db"
    code = (
        "import os, sys; from tttr.sessions.store import Store\n"
        "s = Store.open(sys.argv[1]); r = s.begin_run(seed=1)\n"
        "s.append(r, '0:clock', {'t': 'x'}); s.commit_step(r)\n"
        "os._exit(0)  # no close, no finish\n"
    )
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, cwd=ROOT)
    with Store.open(path, readonly=True) as store:
        assert store.run(1).status == "incomplete"
    assert sqlite3.connect(path).execute("SELECT status FROM runs").fetchone()[0] == "recording"  # read-only: unchanged
    with Store.open(path) as store:  # a writable open records what it found
        assert store.run(1).status == "incomplete"
    assert sqlite3.connect(path).execute("SELECT status FROM runs").fetchone()[0] == "incomplete"


def test_closing_a_store_leaves_its_unfinished_runs_incomplete(tmp_path):
    with Store.open(tmp_path / "c.db") as store:
        rid = store.begin_run()
        assert store.run(rid).status == "recording"
    with Store.open(tmp_path / "c.db") as store:
        assert store.run(rid).status == "incomplete"


def test_a_damaged_value_is_reported_not_raised_as_a_traceback(tmp_path):
    path = tmp_path / "v.db"
    with Store.open(path) as store:
        rid = record(store, steps=1)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE events SET value = x'01ff' WHERE id = ?", (rid << 32 | 2,))
    conn.commit()
    conn.close()
    with Store.open(path, readonly=True) as store:
        assert len(store.events(rid, 0, 2)) == 2 and all(e.problem is None for e in store.events(rid, 0, 2))
        events = store.events(rid)  # the damaged event is handed out marked, not raised
        bad = events[2]
        assert bad.value is None and "cannot be decoded" in bad.problem
        assert [e.seq for e in events if e.problem] == [2]
        assert store.event_at(rid, bad.site).problem == bad.problem


def test_a_reader_sees_each_step_as_the_writer_commits_it(tmp_path):
    path = tmp_path / "live.db"
    with Store.open(path) as writer:
        rid = writer.begin_run(seed=SEED)
        record_step(writer, rid, 0)
        with Store.open(path, readonly=True) as reader:
            assert reader.run(rid).status == "recording" and reader.steps(rid) == 1
            writer.append(rid, "1:clock", {"t": "2026-11-29T10:01:00"})
            assert reader.count_events(rid) == 13  # not yet committed
            writer.commit_step(rid)
            assert reader.count_events(rid) == 14 and reader.event_at(rid, "1:clock").value == {"t": "2026-11-29T10:01:00"}


@settings(max_examples=60, deadline=None)
@given(events=st.lists(st.tuples(st.integers(-1, 3),
                                 st.none() | st.integers(0, 20) | st.text(max_size=6),
                                 # a kind with a shape rule takes values of its shape; "note" has none
                                 st.tuples(st.just("token"), token_values) | st.tuples(st.just("logits"), logits_values)
                                 | st.tuples(st.just("note"), json_values)),
                       min_size=1, max_size=8))
def test_events_round_trip_through_the_file(tmp_path_factory, events):
    path = tmp_path_factory.mktemp("rt") / "rt.db"
    expected = []
    with Store.open(path) as store:
        rid = store.begin_run(seed=SEED)
        for step, where, (kind, value) in events:
            site = f"{step}:{kind}" if where is None else f"{step}:{kind}:{where}" if isinstance(where, int) else where
            store.append_event(rid, step, "trace", kind, site, value)
            # the setup step's old spelling (`-1:note`) reads back as `setup:note`
            expected.append((step, kind, canonical_site(site), json.loads(json.dumps(value))))
        store.commit_step(rid)
    with Store.open(path, readonly=True) as store:
        assert [(e.step, e.kind, e.site, e.value) for e in store.events(rid)] == expected
        for i, (step, kind, site, value) in enumerate(expected):
            first = next(j for j, x in enumerate(expected) if x[2] == site)
            assert store.event_at(rid, site).seq == first


def test_the_database_file_alone_holds_every_run_a_closed_writer_wrote(tmp_path):
    """A reader that stays open (the app) keeps SQLite from checkpointing at the writer's
    close; the writer checkpoints itself, so copying the .db alone shares every run."""
    import shutil

    path = tmp_path / "s.db"
    Store.open(path).close()
    reader = Store.open(path, readonly=True)
    assert reader.runs() == []
    writer = Store.open(path)
    rid = writer.begin_run(seed=SEED)
    for pos in range(3):
        writer.append(rid, f"0:token:{pos}", {"id": pos})
    writer.commit_step(rid)
    writer.finish_run(rid, outcome={"passed": True})
    writer.close()
    copy = tmp_path / "copy.db"
    shutil.copyfile(path, copy)  # the .db file alone, without its -wal
    assert not (tmp_path / "copy.db-wal").exists()
    shared = Store.open(copy, readonly=True)
    try:
        assert [(r.id, r.status) for r in shared.runs()] == [(rid, "complete")]
        assert [e.value["id"] for e in shared.events(rid)] == [0, 1, 2]
    finally:
        shared.close()
        reader.close()


# --------------------------------------------------------------------------- managing runs
def _fork_tree(store: Store) -> tuple[int, int, int, int]:
    """A parent, a fork of it that recorded two steps of its own, a fork of that fork,
    and an unrelated run."""
    parent = record(store, steps=4)
    fork = store.begin_run(parent=parent, fork_site="2:token:3", mutation={"site": "2:token:3", "value": "x"}, seed=SEED)
    store.append(fork, "2:token:3", token(2, 3, tid=999))
    store.commit_step(fork)
    record_step(store, fork, 3, positions=2)
    store.finish_run(fork, "complete", {"passed": False})
    grandchild = store.begin_run(parent=fork, fork_seq=store.count_events(fork) - 1, seed=SEED)
    record_step(store, grandchild, 3, positions=1)
    store.finish_run(grandchild, "incomplete", {"reason": "cancelled"})
    other = record(store, steps=2)
    return parent, fork, grandchild, other


def _contents(store: Store, run_id: int) -> list[tuple]:
    return [(e.seq, e.site, e.value, e.origin) for e in store.events(run_id)]


def test_deleting_a_fork_removes_only_its_own_events_and_row(tmp_path):
    path = tmp_path / "s.db"
    with Store.open(path) as store:
        parent, fork, grandchild, other = _fork_tree(store)
        kept = {r: _contents(store, r) for r in (parent, other)}
        kept_steps = {r: store.steps(r) for r in (parent, other)}
        fork_prefix = _contents(store, fork)[: store.run(grandchild).fork_seq]
        with pytest.raises(StoreError, match=rf"run {fork} has 1 fork.*\({grandchild}\).*delete those first"):
            store.delete_run(fork)
        assert _contents(store, grandchild)[: len(fork_prefix)] == fork_prefix  # the refusal changed nothing
        store.delete_run(grandchild)
        store.delete_run(fork)
        assert [r.id for r in store.runs()] == [parent, other]
        assert {r: _contents(store, r) for r in (parent, other)} == kept
        assert {r: store.steps(r) for r in (parent, other)} == kept_steps
        for gone in (fork, grandchild):
            assert store._conn.execute("SELECT count(*) FROM events WHERE id >> 32 = ?", (gone,)).fetchone()[0] == 0
            assert store._conn.execute("SELECT count(*) FROM steps WHERE run = ?", (gone,)).fetchone()[0] == 0
            with pytest.raises(StoreError, match=f"no run {gone}"):
                store.run(gone)
        assert store.check() == []
    with Store.open(path, readonly=True) as reader:  # and so the file says, read afresh
        assert [r.id for r in reader.runs()] == [parent, other]
        assert {r: _contents(reader, r) for r in (parent, other)} == kept
        assert reader.check() == []


def test_a_run_with_forks_or_being_recorded_is_not_deleted(db):
    parent, fork, grandchild, other = _fork_tree(db)
    for run_id in (parent, fork):
        with pytest.raises(StoreError, match="delete those first"):
            db.delete_run(run_id)
    live = db.begin_run(seed=SEED)
    with pytest.raises(StoreError, match="still being recorded"):
        db.delete_run(live)
    with pytest.raises(StoreError, match="no run 99"):
        db.delete_run(99)
    assert [r.id for r in db.runs()] == [parent, fork, grandchild, other, live]
    with Store.open(db.path, readonly=True) as reader, pytest.raises(StoreError, match="read-only"):
        reader.delete_run(other)


def test_a_run_can_be_renamed_and_the_name_is_checked(tmp_path):
    path = tmp_path / "s.db"
    with Store.open(path) as store:
        parent, fork, _, other = _fork_tree(store)
        before = _contents(store, fork)
        store.rename_run(fork, "  the clock fork  ")
        assert store.run(fork).name == "the clock fork" and store.run(parent).name is None
        assert _contents(store, fork) == before
        for bad, why in (("", "is empty"), ("a\nb", "control character"), ("x" * 81, "81 characters"), (7, "text")):
            with pytest.raises(StoreError, match=why):
                store.rename_run(other, bad)
        assert store.run(other).name is None
        with pytest.raises(StoreError, match="no run 99"):
            store.rename_run(99, "x")
        store.rename_run(other, None)
    with Store.open(path, readonly=True) as reader:
        assert [r.name for r in reader.runs()] == [None, "the clock fork", None, None]


def test_a_reader_notices_another_connections_commit_by_data_version(tmp_path):
    path = tmp_path / "s.db"
    Store.open(path).close()
    with Store.open(path, readonly=True) as reader, Store.open(path) as writer:
        first = reader.data_version()
        assert reader.data_version() == first  # nothing committed in between
        rid = writer.begin_run(seed=SEED)
        assert reader.data_version() != first
        second = reader.data_version()
        record_step(writer, rid, 0, positions=1)
        assert reader.data_version() != second and reader.count_events(rid) == 5


# --------------------------------------------------------------------------- collecting blobs
def _blob_run(store: Store, tree: Path, output: bytes) -> tuple[int, str, str]:
    """A run whose tool output is a blob and whose step stores a snapshot of `tree`:
    (run, the output's digest, the manifest's digest)."""
    from tttr.recorders.snapshot import snapshot

    rid = store.begin_run(task="t", seed=SEED)
    out = store.put_blob(output)
    manifest = snapshot(tree, store)
    store.append(rid, "0:tool", {"cmd": "x", "stdout": {"$blob": out, "size": len(output)},
                                                     "exit_code": 0, "tree_after": manifest})
    store.commit_step(rid)
    store.finish_run(rid, status="complete")
    return rid, out, manifest


def test_collecting_blobs_removes_only_what_no_run_refers_to(tmp_path):
    shared, own = tmp_path / "shared", tmp_path / "own"
    shared.mkdir(), own.mkdir()
    (shared / "a.txt").write_text("kept by both\n")
    (own / "b.txt").write_text("only the deleted run's\n")
    with Store.open(tmp_path / "s.db") as store:
        keep, kept_out, kept_tree = _blob_run(store, shared, b"first output " * 100)
        gone, gone_out, gone_tree = _blob_run(store, own, b"second output " * 100)
        file_a = hashlib.sha256(b"kept by both\n").hexdigest()
        file_b = hashlib.sha256(b"only the deleted run's\n").hexdigest()
        store.put_blob(b"never referenced")
        every = {d for (d,) in store._conn.execute("SELECT digest FROM blobs")}
        assert {kept_out, kept_tree, gone_out, gone_tree, file_a, file_b} < every
        assert store.collect_blobs().removed == 1  # the blob nothing ever referred to
        store.delete_run(gone)
        dry = store.collect_blobs(dry_run=True)
        assert (dry.removed, dry.kept) == (3, len(every) - 4)
        assert {d for (d,) in store._conn.execute("SELECT digest FROM blobs")} == every - {hashlib.sha256(b"never referenced").hexdigest()}
        swept = store.collect_blobs()
        assert swept.removed == 3 and swept.freed_bytes > 0
        left = {d for (d,) in store._conn.execute("SELECT digest FROM blobs")}
        assert left == {kept_out, kept_tree, file_a}  # the manifest's file is kept through the manifest
        assert store.get_blob(kept_out) == b"first output " * 100
        assert store.collect_blobs().removed == 0


def test_collecting_blobs_waits_for_a_recording_run_and_a_readonly_store_refuses(tmp_path):
    with Store.open(tmp_path / "s.db") as store:
        rid = store.begin_run(task="t", seed=SEED)
        store.put_blob(b"its reference is not written yet")
        with pytest.raises(StoreError, match=f"run {rid} is being recorded"):
            store.collect_blobs()
        assert store.has_blob(hashlib.sha256(b"its reference is not written yet").hexdigest())
        store.finish_run(rid, status="complete")
    with Store.open(tmp_path / "s.db", readonly=True) as store:
        with pytest.raises(StoreError, match="read-only"):
            store.collect_blobs()
