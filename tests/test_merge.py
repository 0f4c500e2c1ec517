"""`tttr merge` (issue 30) on real SQLite files: runs, events, steps and blobs copied with ids
remapped (parents, suite anchors, forks that share their parent's prefix), blobs stored once,
labels kept; refusals in one line with nothing written."""

from __future__ import annotations

import sqlite3

import pytest

from tttr.app.cli import main
from tttr.sessions import schema
from tttr.sessions.merge import MergeError, merge
from tttr.sessions.store import Store


def _suite_db(path, suite, label, blob=b"shared blob", n=2):
    """Two runs of a suite (the second a replay child of the first, its anchor), a fork of the
    first that shares its first two events, and a blob."""
    with Store.open(path) as s:
        digest = s.put_blob(blob)
        first = None
        for i in range(n):
            meta = {"suite": {"id": suite, "condition": "free" if i == 0 else "pinned", "index": 0,
                              "anchor": first, "settings": {"label": label}}}
            rid = s.begin_run(task="write-line", model_id="m", seed=7 + i, meta=meta,
                              parent=first, fork_seq=0 if first else None)
            for step in range(2):
                s.append(rid, f"{step}:tool", {"cmd": f"echo {i}.{step}", "blob": digest})
                s.append(rid, f"{step}:token:0", {"id": step, "forced": False})
                s.commit_step(rid)
            s.finish_run(rid, "complete", {"passed": i == 0})
            first = first or rid
        fork = s.begin_run(task="write-line", model_id="m", seed=7, parent=first, fork_seq=2, meta={"note": "fork"})
        s.append(fork, "1:tool", {"cmd": "echo forked"})
        s.commit_step(fork)
        s.finish_run(fork, "complete", {"passed": False})
        s.begin_run(task="write-line", model_id="m", meta={})  # left recording: arrives incomplete
    return path


def _dump(store) -> list:
    out = []
    for r in store.runs():
        events = [(e.seq, e.step, e.layer, e.kind, e.site, e.value) for e in store.events(r.id)]
        out.append((r.task, r.seed, r.outcome, r.fork_seq, events))
    return out


def test_merge_copies_runs_with_ids_remapped_and_blobs_once(tmp_path):
    a = _suite_db(tmp_path / "a.db", "s1", "hot")
    b = _suite_db(tmp_path / "b.db", "s2", "cold", blob=b"shared blob")
    out = tmp_path / "m.db"
    res = merge([a, b], out)
    assert res.runs == 8 and res.blobs_added == 1 and res.blobs_shared == 1
    with Store.open(a, readonly=True, create=False) as sa, Store.open(b, readonly=True, create=False) as sb, \
            Store.open(out, readonly=True, create=False) as m:
        assert _dump(m) == _dump(sa) + _dump(sb)  # every event, as stored, forks reading their parent's prefix
        runs = m.runs()
        assert [r.id for r in runs] == list(range(1, 9))
        second = runs[4:]
        assert second[1].parent == second[0].id == 5 and second[1].meta["suite"]["anchor"] == 5
        assert second[2].parent == 5 and second[2].meta["merged_from"] == {"db": "b.db", "run": 3}
        assert runs[3].status == "incomplete" and runs[7].status == "incomplete"
        assert res.run_ids[(1, 1)] == 5


def test_merge_command_appends_and_refuses_conflicts_writing_nothing(tmp_path, capsys):
    a = _suite_db(tmp_path / "a.db", "s1", "hot")
    b = _suite_db(tmp_path / "b.db", "s2", "cold")
    out = tmp_path / "m.db"
    assert main(["merge", str(a), "--into", str(out)]) == 0
    assert "merged 4 run(s)" in capsys.readouterr().out
    before = out.read_bytes()
    for argv, says in (
        (["merge", str(b), "--into", str(out)], "exists"),
        (["merge", str(_suite_db(tmp_path / "c.db", "s1", "other")), "--into", str(tmp_path / "n.db")], None),
    ):
        assert main(argv) == (0 if says is None else 2)
        err = capsys.readouterr().err
        if says:
            assert says in err and err.count("\n") == 1
    # the same suite labelled differently in two databases
    assert main(["merge", str(a), str(tmp_path / "c.db"), "--into", str(tmp_path / "x.db")]) == 2
    assert "labelled 'hot'" in capsys.readouterr().err and not (tmp_path / "x.db").exists()
    # one label on two suites
    d = _suite_db(tmp_path / "d.db", "s9", "hot")
    assert main(["merge", str(d), "--into", str(out), "--append"]) == 2
    assert "label 'hot' names suite" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main(["merge", str(b), "--into", str(out), "--append"]) == 0
    with Store.open(out, readonly=True, create=False) as m:
        assert len(m.runs()) == 8 and {r.meta.get("suite", {}).get("id") for r in m.runs()} >= {"s1", "s2"}


def test_merge_refuses_another_schema_and_foreign_files(tmp_path):
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old, isolation_level=None)
    schema.migrate(conn, upto=2)
    conn.close()
    with pytest.raises(MergeError, match="schema version 2") as info:
        merge([old], tmp_path / "m.db")
    assert info.value.exit_code == 2 and not (tmp_path / "m.db").exists()
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(Exception, match="not a TTTR session database"):
        merge([foreign], tmp_path / "m.db")
    assert not (tmp_path / "m.db").exists()
    assert not list(tmp_path.glob(".m.db*"))


def test_merge_with_known_runs_copies_only_the_new_ones(tmp_path):
    """A worker's database that began as a copy of the target: its first runs are the
    target's own, its new child names one of them as parent."""
    import shutil

    target = _suite_db(tmp_path / "t.db", "s1", "hot")
    worker = tmp_path / "w.db"
    shutil.copy(target, worker)
    with Store.open(worker) as s:
        child = s.begin_run(task="write-line", model_id="m", seed=7, parent=1, fork_seq=0,
                            meta={"suite": {"id": "s1", "condition": "pinned", "index": 1, "anchor": 1}})
        s.append(child, "0:tool", {"cmd": "echo again"})
        s.commit_step(child)
        s.finish_run(child, "complete", {"passed": True})
    with Store.open(target, readonly=True, create=False) as t:
        ids = [r.id for r in t.runs()]
    res = merge([worker], target, append=True, known={(0, i): i for i in ids})
    assert res.runs == 1 and res.blobs_added == 0
    with Store.open(target, readonly=True, create=False) as t:
        runs = t.runs()
        assert len(runs) == len(ids) + 1
        new = runs[-1]
        assert new.parent == 1 and new.meta["suite"]["anchor"] == 1
        assert [e.value["cmd"] for e in t.events(new.id, kind="tool")] == ["echo again"]
