"""A recorded program is untrusted code, and a session database untrusted data, while TTTR's
host side runs as root beside the program's tree (CI's case). Nothing outside the tree TTTR
made for a run may be read or written because of what a program did or what a database says:
no link planted in the tree is followed, no FIFO or device is opened, no host path in a
database is trusted. The hostile-database cases of the other commands: tests/test_hostile_db.py."""

from __future__ import annotations

import json
import os
import sqlite3
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tttr.app.cli import main
from tttr.engine.serve.sdk_tree import sync_tree
from tttr.recorders import treeio
from tttr.recorders.errors import SnapshotError
from tttr.recorders.memstore import MemoryStore
from tttr.recorders.snapshot import manifest_bytes, read_manifest, scan, snapshot
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import program_tree, record_program, replay_json

SECRET = b"host secret: do not store\n"


def _host(tmp_path: Path) -> dict[str, Path]:
    """Files and folders of "the host": outside every tree, owned by root, 0600/0700."""
    host = tmp_path / "host"
    host.mkdir(mode=0o700)
    files = {name: host / name for name in ("victim", "victim2", "secret")}
    for name, path in files.items():
        path.write_bytes(SECRET if name == "secret" else b"host file\n")
        path.chmod(0o600)
    for name in ("dir", "dir2"):
        (host / name).mkdir(mode=0o700)
        files[name] = host / name
    return files


def _host_state(files: dict[str, Path]) -> dict:
    return {name: (p.stat().st_mode, sorted(os.listdir(p)) if p.is_dir() else p.read_bytes())
            for name, p in files.items()}


# ------------------------------------------------------------------ putting recorded files back
def test_putting_recorded_files_back_never_writes_through_a_planted_link(tmp_path):
    host = _host(tmp_path)
    before = _host_state(host)
    recorded = tmp_path / "recorded"
    (recorded / "sub").mkdir(parents=True)
    (recorded / "d").mkdir(mode=0o700)
    (recorded / "out.txt").write_text("recorded\n")
    (recorded / "sub" / "x.txt").write_text("x\n")
    store = MemoryStore()
    manifest = snapshot(recorded, store)
    tree = tmp_path / "tree"  # what the program left when it asked for the pinned tool
    tree.mkdir()
    stop = threading.Event()

    def plant() -> None:  # the program's background thread, planting links while the host works
        while not stop.is_set():
            for target, name in ((host["victim"], "out.txt"), (host["victim2"], ".out.txt.tttr-sync"),
                                 (host["dir"], "sub"), (host["dir2"], "d")):
                try:
                    os.symlink(target, tree / name)
                except OSError:
                    pass

    planter = threading.Thread(target=plant, daemon=True)
    planter.start()
    try:
        for _ in range(300):
            try:
                sync_tree(tree, manifest, store)
            except (SnapshotError, OSError):
                pass  # the program changed the tree under it: may fail, but never follow a link
    finally:
        stop.set()
        planter.join(5)
    assert _host_state(host) == before
    for name in ("out.txt", ".out.txt.tttr-sync", "sub", "d"):
        if (tree / name).is_symlink():
            (tree / name).unlink()
    sync_tree(tree, manifest, store)
    assert (tree / "out.txt").read_text() == "recorded\n" and not (tree / "out.txt").is_symlink()
    assert (tree / "sub").is_dir() and not (tree / "sub").is_symlink() and (tree / "sub" / "x.txt").read_text() == "x\n"
    assert not (tree / "d").is_symlink() and (tree / "d").stat().st_mode & 0o777 == 0o700
    assert [(e.path, e.kind, e.ref) for e in scan(tree)] == [(e.path, e.kind, e.ref) for e in scan(recorded)]


def test_a_manifest_with_a_path_twice_or_values_of_the_wrong_type_is_refused(tmp_path):
    store = MemoryStore()
    twice = store.put_blob(manifest_bytes([]).replace(b'"entries":[]', b'"entries":[[".","d",448,0,0,""],'
                                                      b'["a","f",420,0,1,"x"],["a","l",511,0,1,"/etc"]]'))
    with pytest.raises(SnapshotError, match="listed twice"):
        read_manifest(twice, store)
    typed = store.put_blob(manifest_bytes([]).replace(b'"entries":[]', b'"entries":[[".","d","rwx",0,0,""]]'))
    with pytest.raises(SnapshotError, match="wrong types"):
        read_manifest(typed, store)


# ------------------------------------------------------------------ reading a program's tree
def _flip(tree: Path, target: str, stop: threading.Event) -> None:
    """Swap tree/f between a regular file and a link to `target`, as fast as it goes."""
    f, tmp = tree / "f", tree / "f.tmp"
    while not stop.is_set():
        tmp.write_bytes(b"bait\n")
        os.replace(tmp, f)
        try:
            os.symlink(target, tmp)
        except FileExistsError:
            os.unlink(tmp)
            continue
        os.replace(tmp, f)


@pytest.mark.parametrize("target", ["secret", "fifo", "/dev/zero"])
def test_a_file_swapped_for_a_link_while_snapshotted_is_never_read_through_it(tmp_path, target):
    host = _host(tmp_path)
    os.mkfifo(tmp_path / "host" / "fifo")
    tree = tmp_path / "tree"
    tree.mkdir()
    stop = threading.Event()
    flipper = threading.Thread(target=_flip, args=(tree, str(host["secret"].parent / target)
                                                   if not target.startswith("/") else target, stop), daemon=True)
    store = MemoryStore()
    done = []

    def snapshots() -> None:
        for _ in range(400):
            snapshot(tree, store)
        done.append(True)

    flipper.start()
    worker = threading.Thread(target=snapshots, daemon=True)
    try:
        worker.start()
        worker.join(120)  # a FIFO opened for reading would block it for good
    finally:
        stop.set()
        flipper.join(5)
    assert done, "snapshotting blocked on what a link in the tree points at"
    assert all(SECRET not in blob for blob in store.blobs.values())
    assert all(len(blob) < 1 << 20 for blob in store.blobs.values())  # /dev/zero never read


def test_fifos_devices_and_links_are_never_opened_as_files(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    os.mkfifo(tree / "fifo")
    os.symlink("/dev/zero", tree / "zero")
    os.symlink("fifo", tree / "to-fifo")
    with treeio.opened_root(str(tree)) as fd:
        assert all(treeio.open_regular(fd, name) is None for name in ("fifo", "zero", "to-fifo", "missing"))
    entries = {e.path: e.kind for e in scan(tree)}
    assert entries == {".": "d", "to-fifo": "l", "zero": "l"}


def test_a_tree_nested_past_the_limit_is_named_not_a_crash(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(1100):  # by descriptor: 2,200 characters of path, and os.makedirs recurses
        os.mkdir("d", dir_fd=fd)
        fd, old = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
        os.close(old)
    os.close(fd)
    with pytest.raises(SnapshotError, match="nested deeper than 512 directories"):
        snapshot(tree, MemoryStore())
    os.symlink(tmp_path / "host", tree / "d" / "host")  # removing the tree does not follow it
    (tmp_path / "host").mkdir()
    (tmp_path / "host" / "kept").write_text("kept\n")
    assert treeio.remove_tree(tree) is True  # shutil.rmtree recurses: RecursionError
    assert not tree.exists() and (tmp_path / "host" / "kept").read_text() == "kept\n"


# ------------------------------------------------------------------ whole programs, as root
PLANTER = textwrap.dedent("""\
    import os, threading
    from tttr.recorders import sdk

    @sdk.tool
    def note(text):
        with open("log.txt", "a") as f:
            f.write(text + "\\n")
        return len(text)

    def plant():  # while the host puts the pinned tool's files back
        while True:
            for target, name in (({victim!r}, "log.txt"), ({victim2!r}, ".log.txt.tttr-sync"), ({dir!r}, "logs")):
                try:
                    os.symlink(target, name)
                except OSError:
                    pass

    if os.environ.get("TTTR_REPLAY"):  # replayed: the host puts the recorded files back
        threading.Thread(target=plant, daemon=True).start()
    else:
        os.makedirs("logs", exist_ok=True)
    for i in range(20):
        note(f"hello {{i}}")
    print("done")
""")


@pytest.mark.slow
@needs_sandbox
def test_a_replayed_program_cannot_make_the_host_write_through_links_it_plants(tmp_path, capsys):
    host = _host(tmp_path)
    before = _host_state(host)
    source = PLANTER.format(victim=str(host["victim"]), victim2=str(host["victim2"]), dir=str(host["dir"]))
    tree, db = program_tree(tmp_path, "tree", source), tmp_path / "s.db"
    rec = record_program(capsys, db, tree)
    assert rec["exit_code"] == 0, rec["stderr"]
    replay_json(capsys, db, rec["run_id"])  # its verdict does not matter here: the host's files do
    assert _host_state(host) == before


@pytest.mark.slow
@needs_sandbox
def test_a_database_naming_a_host_folder_and_linking_the_program_touches_no_host_file(tmp_path, capsys):
    host = _host(tmp_path)
    tree, db = program_tree(tmp_path, "tree", "print('recorded code')\n"), tmp_path / "s.db"
    rec = record_program(capsys, db, tree)
    evil = tmp_path / "evil"  # what a crafted meta.tree names: a program that is a link to a root-only file
    evil.mkdir()
    os.symlink(host["secret"], evil / "prog.py")
    with Store.open(db) as store:
        setup = next(e for e in store.events(rec["run_id"], kind="setup"))
        entries = read_manifest(setup.value["snapshot"], store)
        linked = [e.row() if e.path != "prog.py" else ["prog.py", "l", 0o777, e.mtime_ns, 1, str(host["victim"])]
                  for e in entries]
        manifest = store.put_blob(json.dumps({"format": "tttr-tree/1", "entries": linked},
                                             separators=(",", ":")).encode())
        meta = {**store.run(rec["run_id"]).meta, "tree": str(evil)}
    before = _host_state(host)
    conn = sqlite3.connect(db)
    conn.execute("UPDATE runs SET meta = ? WHERE id = ?", (json.dumps(meta), rec["run_id"]))
    conn.execute("UPDATE events SET value = ? WHERE id = ?",
                 (json.dumps({**setup.value, "snapshot": manifest}), rec["run_id"] << 32 | setup.seq))
    conn.commit()
    conn.close()
    main(["replay", str(rec["run_id"]), "--db", str(db), "--json"])
    capsys.readouterr()
    assert _host_state(host) == before
    with sqlite3.connect(db) as conn:
        blobs = [zlib_or_raw(row[0]) for row in conn.execute("SELECT data FROM blobs")]
    assert all(SECRET not in blob for blob in blobs)


def zlib_or_raw(data: bytes) -> bytes:
    import zlib

    try:
        return zlib.decompress(data)
    except zlib.error:
        return data


RACER = textwrap.dedent("""\
    import os, threading
    from tttr.recorders import sdk

    @sdk.tool
    def tick(i):
        return i

    def flip():
        while True:
            with open("f.tmp", "w") as f:
                f.write("bait\\n")
            os.replace("f.tmp", "f")
            os.symlink({secret!r}, "f.tmp")
            os.replace("f.tmp", "f")

    threading.Thread(target=flip, daemon=True).start()
    for i in range(300):
        tick(i)
    print("done")
""")


@pytest.mark.slow
@needs_sandbox
def test_a_program_swapping_a_file_for_a_link_while_recorded_stores_no_host_file(tmp_path, capsys):
    host = _host(tmp_path)
    tree, db = program_tree(tmp_path, "tree", RACER.format(secret=str(host["secret"]))), tmp_path / "s.db"
    started = time.monotonic()
    rec = record_program(capsys, db, tree)
    assert rec["exit_code"] == 0 and rec["stdout"].strip() == "done", (rec["stderr"], time.monotonic() - started)
    with sqlite3.connect(db) as conn:
        blobs = [zlib_or_raw(row[0]) for row in conn.execute("SELECT data FROM blobs")]
        tools = conn.execute("SELECT count(*) FROM event_rows WHERE kind = 'tool'").fetchone()[0]
    assert tools >= 300
    assert all(SECRET not in blob for blob in blobs)


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("field, value", [("clock", "0001-01-01T00:00:00"), ("clock", "not a time"), ("clock", 7),
                                          ("program", [1, {}]), ("program", []), ("snapshot", ["x"])])
def test_a_replay_refused_for_its_database_writes_nothing_and_prints_no_progress(tmp_path, capsys, field, value):
    tree, db = program_tree(tmp_path, "tree", "print('hi')\n"), tmp_path / "s.db"
    rec = record_program(capsys, db, tree)
    with Store.open(db) as store:
        setup = next(e for e in store.events(rec["run_id"], kind="setup"))
    conn = sqlite3.connect(db)
    conn.execute("UPDATE events SET value = ? WHERE id = ?",
                 (json.dumps({**setup.value, field: value}), rec["run_id"] << 32 | setup.seq))
    conn.commit()
    conn.close()
    before = db.read_bytes()
    for argv in (["replay", str(rec["run_id"])], ["fork", str(rec["run_id"]), "--at", "setup:clock", "--set", "+1h"]):
        assert main([*argv, "--db", str(db)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert db.read_bytes() == before


def test_write_beneath_never_follows_a_link_nor_opens_a_fifo_and_keeps_a_files_mode(tmp_path):
    """treeio.write_beneath (a fork's setup:file, agent runs and programs alike): a link, a FIFO
    or a folder at the path is NotRegularFile, a link on the way an OSError, nothing outside
    written and nothing blocked; an existing file keeps its mode, a new one is 0o644."""
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    (tree / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret").write_text("keep")
    os.symlink(outside / "secret", tree / "link")
    os.symlink(outside, tree / "away")
    os.mkfifo(tree / "fifo")
    for rel in ("link", "fifo", "sub"):
        with pytest.raises(treeio.NotRegularFile):
            treeio.write_beneath(str(tree), rel, b"planted")
    with pytest.raises(OSError):
        treeio.write_beneath(str(tree), "away/x", b"planted")
    assert (outside / "secret").read_text() == "keep" and sorted(os.listdir(outside)) == ["secret"]
    (tree / "sub" / "run.sh").write_text("old")
    os.chmod(tree / "sub" / "run.sh", 0o755)
    treeio.write_beneath(str(tree), "sub/run.sh", b"new")
    treeio.write_beneath(str(tree), "sub/made.txt", b"made")
    assert (tree / "sub" / "run.sh").read_text() == "new" and (tree / "sub" / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (tree / "sub" / "made.txt").stat().st_mode & 0o777 == 0o644
    assert sorted(os.listdir(tree / "sub")) == ["made.txt", "run.sh"]  # no temporary name left
