"""A session database is untrusted input: hostile contents, and every reading command.

Each case builds a valid database through the store, then corrupts it with plain sqlite3
(control sequences, markup, values of the wrong type or shape, deep nesting, huge numbers,
a compression bomb) or puts something odd at its path (a FIFO, a symlink loop, a read-only
folder). Every reading command must then either refuse it in one line (exit 2, no
traceback) or show it safely (no raw control characters, brackets shown as they are), and
leave the file exactly as it was. The refusals of `fork` and `record` are checked too:
they must come before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from tttr.app.cli import main
from tttr.sessions.store import Store, StoreError

ROOT = Path(__file__).resolve().parent.parent
SEED = 7
CLOCK = "2026-03-01T09:00:00"
TASK = "write-line"
# What a terminal acts on: C0 but \t \n, DEL, C1, and the bidi/format characters.
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202eevil"  # retitle, clear screen, C1 CSI, bidi override


# --------------------------------------------------------------------------- a valid database
def _write_run(store: Store, cmds: list[str], model_id: str = "m") -> int:
    rid = store.begin_run(
        task=TASK, model_id=model_id, kernel_mode="invariant", seed=SEED,
        sampling={"temperature": 0.7, "top_p": 1.0, "top_k": 0},
        meta={"clock": CLOCK, "limits": {"max_steps": 6, "max_message_tokens": 48}},
    )
    store.append(rid, "-1:clock", {"t": CLOCK})
    store.append(rid, "-1:setup", {"task": TASK, "clock": CLOCK, "tree": "0" * 64, "snapshot": None})
    store.commit_step(rid)
    for s, cmd in enumerate(cmds):
        store.append(rid, f"{s}:prompt", {"ids_digest": "ab" * 16, "n_tokens": 100})
        for p in range(2):
            store.append(rid, f"{s}:token:{p}",
                         {"id": 10 + p, "text": "x", "forced": False, "logprob": -0.5, "rng": [SEED, s, p]})
            store.append(rid, f"{s}:logits:{p}",
                         {"digest": "cd" * 16, "topk": [[10 + p, -0.5]], "batch": [1, [0]], "mode": "invariant"})
        store.append(rid, f"{s}:message", {"text": f"```bash\n{cmd}\n```"})
        store.append(rid, f"{s}:action", {"cmd": cmd})
        store.append(rid, f"{s}:clock", {"t": f"2026-03-01T09:00:0{s + 1}"})
        store.append(rid, f"{s}:tool", {
            "cmd": cmd, "cwd": "/work", "exports": {}, "env": {}, "stdout": f"out {s}\n", "stderr": "",
            "exit_code": 0, "tree_before": "0" * 64, "tree_after": "0" * 64, "snapshot": None,
        })
        store.commit_step(rid)
    last = len(cmds) - 1
    outcome = {"passed": True, "checker_exit": 0, "checker_output": "", "tree": "0" * 64, "clock": CLOCK}
    store.append(rid, f"{last}:outcome", outcome)
    store.finish_run(rid, "complete", outcome)
    return rid


def build(path: Path, model_id: str = "m") -> None:
    """Run 1 and run 2 (which differs at step 1), both complete."""
    with Store.open(path) as store:
        _write_run(store, ["ls", "cat notes.txt"], model_id)
        _write_run(store, ["ls", "wc -l notes.txt"], model_id)


def _event_id(run: int, seq: int) -> int:
    return run << 32 | seq


def _seq_of(conn: sqlite3.Connection, run: int, site: str) -> int:
    (seq,) = conn.execute(
        "SELECT seq FROM event_rows WHERE run = ? AND (site = ? OR (site IS NULL AND"
        " step || ':' || kind || coalesce(':' || pos, '') = ?))", (run, site, site)).fetchone()
    return seq


def set_value(path: Path, site: str, value, run: int = 1) -> None:
    """Replace the stored value at `site` of `run` with `value` (JSON text, bytes or an int) as is."""
    conn = sqlite3.connect(path)
    conn.execute("UPDATE events SET value = ? WHERE id = ?", (value, _event_id(run, _seq_of(conn, run, site))))
    conn.commit()
    conn.close()


def set_run(path: Path, column: str, value, run: int = 1) -> None:
    conn = sqlite3.connect(path)
    conn.execute(f"UPDATE runs SET {column} = ? WHERE id = ?", (value, run))
    conn.commit()
    conn.close()


def sql(path: Path, statement: str, *args) -> None:
    conn = sqlite3.connect(path)
    conn.execute(statement, args)
    conn.commit()
    conn.close()


def tool_value(**fields) -> str:
    value = {"cmd": "cat notes.txt", "cwd": "/work", "exports": {}, "env": {}, "stdout": "", "stderr": "",
             "exit_code": 0, "tree_before": "0" * 64, "tree_after": "0" * 64, "snapshot": None}
    return json.dumps({**value, **fields})


def action(cmd: str) -> str:
    return json.dumps({"cmd": cmd})


def _bomb(path: Path) -> None:
    """A tool's stdout refers to a 300 KB blob that expands to 300 MB."""
    digest = "ab" * 32
    sql(path, "INSERT INTO blobs (digest, size, codec, data) VALUES (?, 1000, 'zlib', ?)",
        digest, zlib.compress(b"\0" * (300 << 20), 9))
    set_value(path, "1:tool", tool_value(stdout={"$blob": digest, "size": 1000}))


# Each case: how to spoil the database, and what must hold. `shows` are texts that must
# appear as they are in the output of the named commands (markup must stay literal);
# `refused` maps a command to a text its one-line error must hold.
CASES: dict[str, dict] = {
    # ---- control sequences, in every kind of string
    "escapes in task": dict(make=lambda p: set_run(p, "task", "t" + ESCAPES)),
    "escapes in status": dict(make=lambda p: set_run(p, "status", ESCAPES), refused={"diff": "its status '\\x1b]0;pwned"}),
    "escapes in model": dict(make=lambda p: set_run(p, "model_id", ESCAPES)),
    "escapes in a command": dict(make=lambda p: (set_value(p, "1:action", action("ls " + ESCAPES)),
                                                  set_value(p, "1:tool", tool_value(cmd="ls " + ESCAPES)))),
    "escapes in a tool output": dict(make=lambda p: set_value(p, "0:tool", tool_value(stdout="ok" + ESCAPES, stderr="\x9b2J"))),
    "escapes in a site": dict(make=lambda p: sql(p, "UPDATE events SET site = ? WHERE id = ?", "0:x" + ESCAPES, _event_id(1, 3))),
    "escapes in a kind name": dict(make=lambda p: sql(p, "UPDATE kinds SET kind = ? WHERE kind = 'message'", "msg" + ESCAPES)),
    "escapes in the outcome": dict(make=lambda p: set_run(p, "outcome", json.dumps({"reason": ESCAPES}))),
    # ---- markup: recorded text is never Rich markup
    "sed with [/] in a command": dict(
        make=lambda p: set_value(p, "1:action", action("sed -e 's/[/]/_/g' paths.txt")),
        shows={"diff": "sed -e 's/[/]/_/g' paths.txt", "events": "s/[/]/_/g"}),
    "tr with [a-z] in a command": dict(
        make=lambda p: set_value(p, "1:action", action("tr '[a-z]' '[A-Z]'")),
        shows={"diff": "tr '[a-z]' '[A-Z]'", "events": "tr '[a-z]' '[A-Z]'"}),
    "[/oops] as status": dict(make=lambda p: set_run(p, "status", "[/oops]"), shows={"runs": "[/oops]", "info": "[/oops]"},
                              refused={"diff": "its status '[/oops]' is not one of"}),
    "[/oops] as task": dict(make=lambda p: set_run(p, "task", "[/oops]"), shows={"runs": "[/oops]"}),
    "[bold] in a tool output": dict(make=lambda p: set_value(p, "0:tool", tool_value(stdout="[bold]x[/bold] [/]")),
                                    shows={"events": "[bold]x[/bold] [/]"}),
    # ---- values of the wrong type or shape: shown marked, refused by readers of values
    "a tool value that is a string": dict(make=lambda p: set_value(p, "1:tool", json.dumps("just text")),
                                          refused={"diff": "run 1, site 1:tool: a tool value must be an object"}),
    "a clock that does not parse": dict(make=lambda p: set_value(p, "0:clock", json.dumps({"t": "yesterday"})),
                                        refused={"diff": "run 1, site 0:clock: "}),
    "an action that is a number": dict(make=lambda p: set_value(p, "0:action", "5"),
                                       refused={"diff": "run 1, site 0:action: a action value must be an object"}),
    "a token id that is text": dict(
        make=lambda p: set_value(p, "0:token:1", json.dumps({"id": "five", "text": "x", "forced": False, "logprob": 0.0, "rng": [7, 0, 1]})),
        refused={"diff": "run 1, site 0:token:1: token field 'id'"}),
    "a tool exit code that is text": dict(make=lambda p: set_value(p, "0:tool", tool_value(exit_code="0")),
                                          refused={"diff": "field 'exit_code'"}),
    "a blob reference that is not a digest": dict(make=lambda p: set_value(p, "0:tool", tool_value(stdout={"$blob": "../../etc"})),
                                                  refused={"diff": "not 64 hex digits"}),
    "a value stored as an integer": dict(make=lambda p: set_value(p, "0:message", 5),
                                         refused={"diff": "stored as an integer"}),
    "a binary token record that is cut": dict(make=lambda p: set_value(p, "0:token:0", b"\x01\xff"),
                                              refused={"diff": "cannot be decoded"}),
    "a value in an unknown binary format": dict(make=lambda p: set_value(p, "0:message", b"\x03abc"),
                                                refused={"diff": "needs a newer tttr"}),
    "a value that is NULL": dict(make=lambda p: set_value(p, "0:message", None), refused={"diff": "stored as NULL"}),
    "a value that is not JSON": dict(make=lambda p: set_value(p, "0:message", "{not json"),
                                     refused={"diff": "not valid JSON"}),
    "a value nested 100,000 deep": dict(make=lambda p: set_value(p, "1:tool", "[" * 100_000 + "]" * 100_000),
                                        refused={"diff": "nested too deeply"}),
    "a value nested 1,000 deep": dict(make=lambda p: set_value(p, "0:message", '{"text": "x", "deep": ' + "[" * 1000 + "]" * 1000 + "}"),
                                      refused={"diff": "run 1, site 0:message: the value is nested"}),
    "a value nested 65 deep": dict(make=lambda p: set_value(p, "0:message", '{"text": "x", "deep": ' + "[" * 64 + "]" * 64 + "}"),
                                   refused={"diff": "nested more than 64 levels"}),
    "an integer of 5,000 digits": dict(make=lambda p: set_value(p, "0:clock", '{"t": 1' + "9" * 5000 + "}"),
                                       refused={"diff": "not valid JSON"}),
    "a kind code not in the kinds table": dict(make=lambda p: sql(p, "UPDATE events SET kind = 999 WHERE id = ?", _event_id(1, 3)),
                                               refused={"diff": "kind code 999"}),
    "a step stored as text": dict(make=lambda p: sql(p, "UPDATE events SET step = 'two' WHERE id = ?", _event_id(1, 3)),
                                  refused={"diff": "its step"}),
    # ---- run metadata of the wrong type: listed, marked, refused by readers of values
    "sampling that is not an object": dict(make=lambda p: set_run(p, "sampling", "[1, 2]"),
                                           refused={"diff": "run 1: its sampling is a list, not an object"}),
    "meta nested 100,000 deep": dict(make=lambda p: set_run(p, "meta", "[" * 100_000 + "]" * 100_000),
                                     refused={"diff": "run 1: its meta cannot be read"}),
    "a seed stored as text": dict(make=lambda p: set_run(p, "seed", "seven"), refused={"diff": "its seed is text, not an integer"}),
    "a fork_seq stored as text": dict(make=lambda p: (set_run(p, "parent", 1, run=2), set_run(p, "fork_seq", "x", run=2)),
                                      refused={"diff": "run 2: its fork_seq is text"}),
    "a created time that is bytes": dict(make=lambda p: set_run(p, "created", b"\x00\xff"), refused={"diff": "its created is bytes"}),
    "a sampling temperature that is text": dict(make=lambda p: set_run(p, "sampling", json.dumps({"temperature": "hot"})),
                                                refused={"diff": "field 'temperature'"}),
    "a parent run that is not in the file": dict(make=lambda p: (set_run(p, "parent", 99, run=2), set_run(p, "fork_seq", 3, run=2)),
                                                 refused={"diff": "run 2: its parent run 99 is not in the file"}),
    "runs that are each other's parent": dict(make=lambda p: (set_run(p, "parent", 2, run=1), set_run(p, "fork_seq", 3, run=1),
                                                              set_run(p, "parent", 1, run=2), set_run(p, "fork_seq", 3, run=2))),
    "a steps index of the wrong types": dict(make=lambda p: sql(p, "UPDATE steps SET step = 'x' || step, first_seq = 'a', last_seq = 'b'")),
    # ---- a run whose writer died: read as incomplete, never rewritten by a reader (diff did)
    "a run left recording by a dead writer": dict(
        make=lambda p: (set_run(p, "status", "recording"), set_run(p, "writer", "no-such-boot:1:1")),
        shows={"runs": "incomplete", "info": "1 incomplete"}),
    "a writer identity that is not one": dict(
        make=lambda p: (set_run(p, "status", "recording"), set_run(p, "writer", 12345)), shows={"runs": "incomplete"}),
    # ---- too large: a compression bomb is only ever read bounded
    "a compression bomb blob": dict(make=_bomb),
}

READS = {
    "runs": ["runs", "{db}"],
    "runs --json": ["runs", "{db}", "--json"],
    "info": ["info", "{db}"],
    "info --json": ["info", "{db}", "--json"],
    "events": ["events", "{db}", "1"],
    "events --json": ["events", "{db}", "1", "--json"],
    "diff": ["diff", "1", "2", "--db", "{db}"],
    "diff --json": ["diff", "1", "2", "--db", "{db}", "--json"],
    "open (loading)": ["open", "{db}", "--run", "1"],  # up to the app, which test_hostile_app.py drives
}


def fingerprint(path: Path) -> dict:
    """Bytes and mtime of the database, and the bytes of its write-ahead log. (A read-only
    connection to a WAL database may leave an empty -wal and an -shm index beside it: SQLite
    needs them to read; an absent log and an empty one hold the same.)"""
    wal = Path(f"{path}-wal")
    st = path.stat()
    return {
        "db": (hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns, st.st_size),
        "wal": hashlib.sha256(wal.read_bytes() if wal.exists() else b"").hexdigest(),
    }


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_safe(code: int, out: str, err: str) -> None:
    assert "Traceback" not in out + err
    assert not RAW_CONTROL.search(out), f"raw control character in stdout: {RAW_CONTROL.search(out).group()!r}"
    assert not RAW_CONTROL.search(err), f"raw control character in stderr: {RAW_CONTROL.search(err).group()!r}"
    if code == 2:
        assert err.startswith("tttr: error: ") and err.count("\n") == 1, err
    else:
        assert code == 0, (code, err)


@pytest.fixture(scope="module")
def clean_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("clean") / "s.db"
    build(path)
    return path


@pytest.fixture
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # long commands on one line, so the texts can be found


def hostile(tmp_path: Path, clean_db: Path, case: str) -> Path:
    path = tmp_path / "s.db"
    shutil.copy(clean_db, path)
    CASES[case]["make"](path)
    assert not Path(f"{path}-wal").exists()
    return path


@pytest.mark.parametrize("command", list(READS))
@pytest.mark.parametrize("case", list(CASES))
def test_reading_commands_show_or_refuse_hostile_contents_and_change_nothing(tmp_path, clean_db, wide, capsys, monkeypatch,
                                                                           case, command):
    import tttr.app.commands.ui as ui

    monkeypatch.setattr(ui, "_run_app", lambda store, run_id, args: 0)
    path = hostile(tmp_path, clean_db, case)
    before = fingerprint(path)
    code, out, err = run_cli([a.format(db=path) for a in READS[command]], capsys)
    assert_safe(code, out, err)
    spec = CASES[case]
    refusal = spec.get("refused", {}).get(command.split()[0])
    if refusal:
        assert code == 2 and refusal in err, err
    else:
        assert code == 0, err
    shows = spec.get("shows", {}).get(command)
    if shows:
        assert shows in out, out
    if command.endswith("--json") and code == 0:
        for line in out.splitlines() if command.startswith(("runs", "events")) else [out]:
            json.loads(line)  # still valid JSON, C1 escaped or not
    assert fingerprint(path) == before


def test_the_escapes_are_shown_not_dropped(tmp_path, clean_db, wide, capsys):
    path = hostile(tmp_path, clean_db, "escapes in a tool output")
    code, out, _ = run_cli(["events", str(path), "1", "--kind", "tool"], capsys)
    # json.dumps escapes C0 as \u001b, visible() the C1 and bidi characters JSON leaves raw
    assert code == 0 and "\\u001b]0;pwned\\u0007\\u001b[2J\\x9b31m\\u202eevil" in out
    code, out, _ = run_cli(["events", str(path), "1", "--kind", "tool", "--json"], capsys)
    assert code == 0 and "\\u009b31m" in out and "\\u202eevil" in out
    assert json.loads(out.splitlines()[0])["value"]["stdout"] == "ok" + ESCAPES  # the JSON still means the same


def test_an_unreadable_value_is_marked_in_events_and_named_in_json(tmp_path, clean_db, wide, capsys):
    path = hostile(tmp_path, clean_db, "a tool value that is a string")
    code, out, _ = run_cli(["events", str(path), "1", "--kind", "tool"], capsys)
    assert code == 0 and "unreadable: a tool value must be an object, not text" in out
    code, out, _ = run_cli(["events", str(path), "1", "--kind", "tool", "--json"], capsys)
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["site"], r["value"], r.get("problem")) for r in rows] == [
        ("0:tool", rows[0]["value"], None), ("1:tool", None, "a tool value must be an object, not text")]


def test_a_run_with_bad_metadata_is_listed_and_marked(tmp_path, clean_db, wide, capsys):
    path = hostile(tmp_path, clean_db, "sampling that is not an object")
    code, out, _ = run_cli(["runs", str(path)], capsys)
    assert code == 0 and "(unreadable)" in out and "run 1 cannot be replayed: its sampling is a list" in out
    code, out, _ = run_cli(["runs", str(path), "--json"], capsys)
    first, second = (json.loads(line) for line in out.splitlines())
    assert first["sampling"] == {} and "sampling" in first["problem"] and second["problem"] is None


# --------------------------------------------------------------------------- blobs
def test_a_compression_bomb_is_refused_or_cut_never_expanded(tmp_path, clean_db):
    path = hostile(tmp_path, clean_db, "a compression bomb blob")
    with Store.open(path, readonly=True) as store:
        digest = store.event_at(1, "1:tool").value["stdout"]["$blob"]
        with pytest.raises(StoreError, match="larger than 67,108,864 bytes"):
            store.get_blob(digest)
        with pytest.raises(StoreError, match="larger than 1,000 bytes"):
            store.get_blob(digest, limit=1000)
        part = store.get_blob_part(digest, limit=4096)
        assert part.data == b"\0" * 4096 and part.complete is False and part.size == 1000


def test_a_blob_that_fits_is_read_whole_and_checked(tmp_path):
    with Store.open(tmp_path / "b.db") as store:
        digest = store.put_blob(b"line\n" * 10_000)
        assert store.get_blob(digest) == b"line\n" * 10_000
        part = store.get_blob_part(digest, limit=1 << 20)
        assert part.complete and part.data == b"line\n" * 10_000
    sql(tmp_path / "b.db", "UPDATE blobs SET data = ?", zlib.compress(b"other\n" * 10))
    with Store.open(tmp_path / "b.db", readonly=True) as store:
        with pytest.raises(StoreError, match="does not match its digest"):
            store.get_blob(digest)


# --------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("argv", [
    ["events", "{db}", "9223372036854775808"],
    ["events", "{db}", "1", "--limit", str(2**64)],
    ["events", "{db}", "1", "--from", str(2**63)],
    ["events", "{db}", "1", "--limit", "1" * 5000],
    ["diff", "1", str(2**64), "--db", "{db}"],
    ["fork", str(2**63), "--at", "0:clock", "--set", "+1h", "--db", "{db}"],
    ["fork", "1", "--at", "99999999999999999999:clock", "--set", "+1h", "--db", "{db}"],
    ["fork", "1", "--at", "0:token:99999999999999999999", "--set", "5", "--db", "{db}"],
    ["replay", "-1", "--db", "{db}"],
    ["record", "--task", TASK, "--seed", str(2**64), "--db", "{db}"],
], ids=lambda a: " ".join(a[:2] + a[2:][:3])[:50])
def test_numbers_beyond_range_are_one_line_exit_2(tmp_path, clean_db, capsys, argv):
    path = tmp_path / "s.db"
    shutil.copy(clean_db, path)
    before = fingerprint(path)
    code, out, err = run_cli([a.format(db=path) for a in argv], capsys)
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(("tttr: error:", "tttr ")), err  # argparse: usage, then one line
    assert fingerprint(path) == before


# --------------------------------------------------------------------------- odd paths
def test_a_fifo_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "pipe.db"
    os.mkfifo(fifo)
    for command in (["info", str(fifo)], ["runs", str(fifo)], ["events", str(fifo), "1"]):
        # A subprocess, so that a command that opened the FIFO would hang into the timeout.
        out = subprocess.run([sys.executable, "-m", "tttr.app", *command], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and out.stderr == f"tttr: error: {fifo} is a FIFO (named pipe), not a session database; pass a session database file\n"


def test_a_fifo_beside_the_database_is_refused(tmp_path, clean_db, capsys):
    path = tmp_path / "s.db"
    shutil.copy(clean_db, path)
    os.mkfifo(f"{path}-wal")
    code, _, err = run_cli(["info", str(path)], capsys)
    assert code == 2 and "s.db-wal beside the database is a FIFO (named pipe)" in err


def test_a_symlink_loop_is_named_as_one(tmp_path, capsys):
    (tmp_path / "a.db").symlink_to(tmp_path / "b.db")
    (tmp_path / "b.db").symlink_to(tmp_path / "a.db")
    code, _, err = run_cli(["info", str(tmp_path / "a.db")], capsys)
    assert code == 2 and "is a symbolic link loop" in err and "does not exist" not in err
    code, _, err = run_cli(["record", "--task", TASK, "--db", str(tmp_path / "a.db")], capsys)
    assert code == 2 and "symbolic link loop" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.db", "b.db"]


def test_a_device_is_refused(capsys):
    code, _, err = run_cli(["info", "/dev/null"], capsys)
    assert code == 2 and "is a character device" in err


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare for a read-only bind mount")
def test_a_healthy_database_in_a_read_only_folder_is_not_called_corrupt(tmp_path, clean_db):
    folder, mount = tmp_path / "data", tmp_path / "ro"
    folder.mkdir()
    mount.mkdir()
    shutil.copy(clean_db, folder / "s.db")
    script = (f"mount --bind {folder} {mount} && mount -o remount,ro,bind {mount} && "
              f"exec {sys.executable} -m app info {mount / 's.db'}")
    out = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if "mount" in out.stderr and "tttr" not in out.stderr:
        pytest.skip(f"no read-only bind mount here: {out.stderr.strip()}")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "is not writable" in out.stderr and "corrupt" not in out.stderr and "restore it" not in out.stderr


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare for a read-only bind mount")
def test_a_new_database_in_a_read_only_folder_is_refused_as_that(tmp_path):
    folder, mount = tmp_path / "data", tmp_path / "ro"
    folder.mkdir()
    mount.mkdir()
    script = (f"mount --bind {folder} {mount} && mount -o remount,ro,bind {mount} && "
              f"exec {sys.executable} -m app record --task {TASK} --unsafe-no-sandbox --db {mount / 'new.db'}")
    out = subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if "mount" in out.stderr and "tttr" not in out.stderr:
        pytest.skip(f"no read-only bind mount here: {out.stderr.strip()}")
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 2 and last.startswith("tttr: error: "), out.stderr
    # not the advice for an existing file ("copy it ... and open the copy"): there is nothing to copy
    assert f"cannot create {mount / 'new.db'}: folder {mount} is not writable" in last and "copy" not in last
    assert list(folder.iterdir()) == []


# --------------------------------------------------------------------------- refused writers write nothing
def runs_in(path: Path) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT id, status FROM runs ORDER BY id").fetchall()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def model_db(tmp_path_factory) -> Path:
    """The clean database, recorded (as far as ids go) with the default model."""
    from tttr.engine.replay.runtime import Runtime

    path = tmp_path_factory.mktemp("model") / "s.db"
    build(path, model_id=Runtime().model_id)
    return path


@pytest.mark.parametrize("argv,message", [
    (["fork", "1", "--at", "0:clock", "--set", "+999999d"], "outside the virtual clock's years 1971–2999"),
    (["fork", "1", "--at", "0:clock", "--set", "+99999999d"], "goes beyond the calendar"),
    (["fork", "1", "--at", "0:clock", "--set", "1900-01-01"], "outside the virtual clock's years"),
    (["fork", "1", "--at", "0:token:0", "--set", "99999999999999999999999"], "outside the vocabulary"),
    (["fork", "1", "--at", "9:clock", "--set", "+1h"], "does not exist in run 1"),
    (["fork", "1", "--at", "0:tool", "--set", '{"stdout": ' + "[" * 100_000 + "]" * 100_000 + "}"], "nested too deeply"),
    (["fork", "1", "--at", "0:tool", "--set", "exit=99999999999999999999999"], "exit code 99999999999999999999 is out of range"),
    (["fork", "1", "--at", "0:tool", "--set", "exit=abc"], "is not exit=N with an integer N"),  # was stdout 'exit=abc'
    (["fork", "3", "--at", "0:clock", "--set", "+1h"], "no run 3"),
    (["replay", "1", "--free", "kernel"], "unknown layer"),
], ids=lambda x: x if isinstance(x, str) else " ".join(x[2:6]))
def test_a_refused_fork_writes_nothing(tmp_path, model_db, capsys, argv, message):
    path = tmp_path / "s.db"
    shutil.copy(model_db, path)
    before, runs = fingerprint(path), runs_in(path)
    code, out, err = run_cli([*argv, "--db", str(path)], capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err  # no progress lines before it
    assert out == "" and runs_in(path) == runs and fingerprint(path) == before


@pytest.mark.parametrize("case", ["a clock that does not parse", "a tool value that is a string", "sampling that is not an object"])
@pytest.mark.parametrize("command", [["replay", "1"], ["fork", "1", "--at", "0:clock", "--set", "+1h"]], ids=lambda c: c[0])
def test_replay_and_fork_refuse_an_unreadable_source_before_writing(tmp_path, model_db, capsys, case, command):
    path = tmp_path / "s.db"
    shutil.copy(model_db, path)
    CASES[case]["make"](path)
    before, runs = fingerprint(path), runs_in(path)
    code, _, err = run_cli([*command, "--db", str(path)], capsys)
    assert code == 2 and err.startswith("tttr: error: run 1") and err.count("\n") == 1, err
    assert runs_in(path) == runs and fingerprint(path) == before


def test_a_fork_whose_shared_prefix_does_not_replay_leaves_no_run(tmp_path, model_db, capsys):
    """The file's prompt digests are not the model's: the prefix cannot be replayed. That is
    only found by replaying it, so the fork begins its run at its first commit, past the prefix."""
    path = tmp_path / "s.db"
    shutil.copy(model_db, path)
    runs = runs_in(path)
    code, _, err = run_cli(["fork", "1", "--at", "1:tool", "--set", "exit=1", "--db", str(path)], capsys)
    assert code == 2 and err.strip().splitlines()[-1].startswith("tttr: error: fork prefix drifted"), err
    assert runs_in(path) == runs


def test_a_recorded_clock_the_sandbox_cannot_show_refuses_the_replay(tmp_path, model_db, capsys):
    path = tmp_path / "s.db"
    shutil.copy(model_db, path)
    set_value(path, "1:clock", json.dumps({"t": "1900-01-01T00:00:00"}))
    runs = runs_in(path)
    code, _, err = run_cli(["replay", "1", "--db", str(path)], capsys)
    assert code == 2 and "run 1, site 1:clock: the clock" in err and "1971" in err
    assert runs_in(path) == runs


def test_a_blob_bomb_in_the_source_refuses_the_replay(tmp_path, model_db, capsys):
    path = tmp_path / "s.db"
    shutil.copy(model_db, path)
    _bomb(path)
    runs = runs_in(path)
    code, _, err = run_cli(["replay", "1", "--db", str(path)], capsys)
    assert code == 2 and "run 1, site 1:tool:" in err and "larger than" in err
    assert runs_in(path) == runs


def test_record_with_a_clock_the_sandbox_cannot_show_creates_nothing(tmp_path, capsys):
    path = tmp_path / "new.db"
    code, out, err = run_cli(["record", "--task", TASK, "--clock", "1900-01-01", "--db", str(path)], capsys)
    assert code == 2 and "--clock" in err and "1971" in err and err.count("\n") == 1, err
    assert not path.exists() and list(tmp_path.iterdir()) == []
