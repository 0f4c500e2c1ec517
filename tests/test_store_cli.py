"""`tttr info/runs/events/bench store`, and bad input: one line, exit code 2, the file unchanged."""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tttr.app.cli import main
from tttr.sessions import schema
from tttr.sessions.store import Store
from test_store import build_v1, record

ROOT = Path(__file__).resolve().parent.parent
READ_COMMANDS = (["info"], ["runs"], ["events", "{db}", "1"])


def argv(command: list[str], db: Path) -> list[str]:
    return [part.format(db=db) for part in command] if "{db}" in command else [*command, str(db)]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def recorded(tmp_path) -> Path:
    path = tmp_path / "ok.db"
    with Store.open(path) as store:
        parent = record(store, steps=3)
        child = store.begin_run(parent=parent, fork_site="1:token:2", mutation={"site": "1:token:2", "value": "y"})
        store.append(child, "1:token:2", {"id": 5, "text": "y", "forced": True, "logprob": -2.0, "rng": [1, 1, 2]})
        store.finish_run(child, "failed", {"passed": False})
    return path


# --------------------------------------------------------------------------- what works
def test_info_runs_and_events(recorded, capsys):
    assert main(["info", str(recorded)]) == 0
    out = capsys.readouterr().out
    assert f"version {schema.SCHEMA_VERSION}" in out and "integrity" in out and "1 complete, 1 failed" in out
    assert main(["info", str(recorded), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["runs"] == 2 and stats["integrity"] == "ok" and stats["events"] == 3 * 13 + 1
    assert main(["runs", str(recorded)]) == 0
    out = capsys.readouterr().out
    assert "complete" in out and "fork of #1 at 1:token:2" in out
    assert main(["runs", str(recorded), "--json"]) == 0
    runs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["id"], r["status"], r["steps"], r["events"]) for r in runs] == [(1, "complete", 3, 39), (2, "failed", 2, 20)]
    assert main(["events", str(recorded), "1", "--from", "13", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "1:clock" in out and "1:logits:0" in out and "1:token:0" in out and "--from 16" in out


def test_events_json_lines_carry_contract_sites(recorded, capsys):
    assert main(["events", str(recorded), "2", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["seq"] for r in rows] == list(range(20))
    assert rows[-1] == {"run": 2, "seq": 19, "step": 1, "layer": "token", "kind": "token", "site": "1:token:2",
                        "value": {"id": 5, "text": "y", "forced": True, "logprob": -2.0, "rng": [1, 1, 2]}, "origin": 2}
    assert rows[0]["site"] == "0:clock" and rows[0]["origin"] == 1
    assert main(["events", str(recorded), "1", "--json", "--layer", "trace", "--kind", "tool", "--from", "14"]) == 0
    sites = [json.loads(line)["site"] for line in capsys.readouterr().out.splitlines()]
    assert sites == ["1:tool", "2:tool"]


def test_reading_commands_leave_the_file_unchanged_even_when_it_is_old(tmp_path, recorded, capsys):
    old = tmp_path / "v1.db"
    build_v1(old)
    for path in (recorded, old):
        before = digest(path)
        for command in READ_COMMANDS:
            assert main(argv(list(command), path)) == 0
        assert digest(path) == before
    assert f"version 1 (read as {schema.SCHEMA_VERSION}" in (main(["info", str(old)]), capsys.readouterr().out)[1]


def test_bench_store_json_has_the_keys(capsys):
    assert main(["bench", "store", "--json", "--events", "2000", "--window-events", "3000"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"append_events_per_s", "window_read_ms", "bytes_per_token_event"} <= set(result)
    assert 0 < result["bytes_per_token_event"] < 120
    assert len(result["load_avg_1m"]) == 2 and all(x >= 0 for x in result["load_avg_1m"])  # how busy the machine was


# --------------------------------------------------------------------------- bad input
def newer(path: Path) -> None:
    with Store.open(path) as store:
        record(store, steps=1)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()


def foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    conn.execute("INSERT INTO notes (body) VALUES ('hello')")
    conn.commit()
    conn.close()


def truncated(path: Path) -> None:
    with Store.open(path) as store:
        record(store, steps=30)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def corrupt(path: Path) -> None:
    with Store.open(path) as store:
        record(store, steps=30)
    data = bytearray(path.read_bytes())
    page = 4096
    for at in range(page, len(data), page):  # every page but the first: headers, cells, all garbage
        data[at : at + 200] = bytes((at + i * 7) % 251 for i in range(200))
    path.write_bytes(bytes(data))


BAD = {
    "missing": (None, "does not exist"),
    "not sqlite": (lambda p: p.write_text("hello, I am a text file\n" * 20), "not a SQLite database"),
    "empty": (lambda p: p.write_bytes(b""), "is empty"),
    "truncated": (truncated, "truncated"),
    "corrupt": (corrupt, "corrupt"),
    "newer": (newer, "newer tttr"),
    "foreign": (foreign, "not a TTTR session database"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: c[0])
def test_bad_files_fail_in_one_line_with_exit_2_and_stay_unchanged(tmp_path, capsys, case, command):
    make, message = BAD[case]
    path = tmp_path / "bad.db"
    if make is not None:
        make(path)
        assert not Path(f"{path}-wal").exists()
    before = digest(path) if path.exists() else None
    files = sorted(tmp_path.iterdir())
    assert main(argv(list(command), path)) == 2
    err = capsys.readouterr().err
    assert err.startswith("tttr: error: ") and err.count("\n") == 1 and message in err, err
    assert (digest(path) if path.exists() else None) == before
    if case != "corrupt":  # a damaged TTTR database passes the header check; SQLite may add its -wal/-shm
        assert sorted(tmp_path.iterdir()) == files  # refused before SQLite saw it: nothing created beside it


def test_a_directory_is_refused(tmp_path, capsys):
    assert main(["runs", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_unknown_run_fails_with_exit_2_and_the_ids_there_are(recorded, capsys):
    before = digest(recorded)
    assert main(["events", str(recorded), "42"]) == 2
    err = capsys.readouterr().err
    assert err == f"tttr: error: no run 42 in {recorded} (it has runs 1–2); `tttr runs {recorded}` lists them\n"
    assert digest(recorded) == before
    with Store.open(recorded) as store:  # a gap: the range is not claimed
        gone = store.begin_run(task="x")
        third = store.begin_run(task="y")
        store.finish_run(gone, "complete", {})
        store.delete_run(gone)
    assert main(["events", str(recorded), "42"]) == 2
    assert f"(it has 3 runs between 1 and {third})" in capsys.readouterr().err


def test_the_console_command_exits_2(tmp_path):
    missing = tmp_path / "nope.db"
    out = subprocess.run([sys.executable, "-m", "tttr.app", "runs", str(missing)], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "does not exist" in out.stderr
    assert not missing.exists()


def test_every_reading_command_takes_the_database_either_way(recorded, capsys):
    """One rule: --db FILE everywhere; the reading commands also take it first."""
    for command in (["info"], ["runs"], ["events", "{db}", "1"]):
        as_first = argv([*command, "--json"], recorded)
        as_option = [part for part in as_first if part != str(recorded)] + ["--db", str(recorded)]
        assert main(as_first) == 0
        first = capsys.readouterr().out
        assert main(as_option) == 0
        assert capsys.readouterr().out == first and first
    for bad, reason in ((["runs"], "give the database"),
                        (["runs", str(recorded), "--db", str(recorded) + "x"], "two databases given")):
        with pytest.raises(SystemExit) as exc:
            main(bad)
        assert exc.value.code == 2 and reason in capsys.readouterr().err


# --------------------------------------------------------------------------- rename and delete
def test_rename_and_delete_a_fork_from_the_command_line(recorded, capsys, monkeypatch):
    with Store.open(recorded, readonly=True) as store:
        parent_events = [(e.seq, e.site, e.value) for e in store.events(1)]
    assert main(["rename", "2", "  token fork ", "--db", str(recorded)]) == 0
    assert "run 2 is now named 'token fork'" in capsys.readouterr().out
    assert main(["runs", str(recorded)]) == 0
    assert "2 token fork" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert main(["delete", "2", "--db", str(recorded)]) == 1  # asked, and the answer was no
    assert "nothing deleted" in capsys.readouterr().out
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert main(["delete", "2", "--db", str(recorded)]) == 0
    assert "deleted run 2 (token fork, fork of #1 at 1:token:2" in capsys.readouterr().out
    with Store.open(recorded, readonly=True) as store:
        assert [r.id for r in store.runs()] == [1]
        assert [(e.seq, e.site, e.value) for e in store.events(1)] == parent_events
        assert store.check() == []


def test_gc_removes_what_a_deleted_run_left_and_vacuum_shrinks_the_file(recorded, capsys):
    with Store.open(recorded) as store:
        big = random.Random(0).randbytes(1 << 20)  # 1 MiB that zlib cannot shrink
        rid = store.begin_run(task="t")
        store.append(rid, "0:tool", {"cmd": "x", "stdout": {"$blob": store.put_blob(big), "size": len(big)}})
        store.finish_run(rid)
        parent_events = [(e.seq, e.site, e.value) for e in store.events(1)]
    assert main(["delete", str(rid), "--db", str(recorded), "--yes"]) == 0
    assert f"`tttr gc --db {recorded}` removes the blobs" in " ".join(capsys.readouterr().out.split())
    before = digest(recorded)
    assert main(["gc", "--db", str(recorded), "--dry-run"]) == 0
    assert "would remove 1 unused blob(s)" in capsys.readouterr().out
    assert digest(recorded) == before  # a dry run changes nothing
    size = recorded.stat().st_size
    assert main(["gc", "--db", str(recorded), "--vacuum"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "removed 1 unused blob(s)" in out and "KiB -> " in out
    assert recorded.stat().st_size < size - 500_000
    with Store.open(recorded, readonly=True) as store:
        assert [(e.seq, e.site, e.value) for e in store.events(1)] == parent_events and store.check() == []
    assert main(["gc", "--db", str(recorded)]) == 0
    assert "removed 0 unused blob(s)" in capsys.readouterr().out


def test_delete_refuses_a_run_with_forks_and_asks_unless_yes(recorded, capsys):
    before = digest(recorded)
    assert main(["delete", "1", "--db", str(recorded), "--yes"]) == 2
    assert "run 1 has 1 fork(s) or replay(s) that read its events (2); delete those first" in capsys.readouterr().err
    assert main(["delete", "2", "--db", str(recorded)]) == 2  # stdin is not a terminal here: no one to ask
    assert "pass --yes" in capsys.readouterr().err
    assert digest(recorded) == before
    assert main(["delete", "2", "--db", str(recorded), "--yes"]) == 0
    assert main(["delete", "1", "--db", str(recorded), "--yes"]) == 0
    with Store.open(recorded, readonly=True) as store:
        assert store.runs() == [] and store.stats()["events"] == 0
