"""Content-addressed snapshots: store once, restore exactly, digest fast and right."""

from __future__ import annotations

import os
import time

import pytest

from tttr.recorders.errors import SnapshotError
from tttr.recorders.memstore import MemoryStore
from tttr.recorders.snapshot import read_manifest, restore, snapshot, tree_digest
from tttr.recorders.treestate import diff_manifests


def _tree(root):
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "deep.txt").write_text("deep\n")
    (root / "one.txt").write_text("same\n")
    (root / "two.txt").write_text("same\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "empty").mkdir()
    os.symlink("one.txt", root / "link")
    os.utime(root / "one.txt", ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    return root


class CountingStore(MemoryStore):
    def __init__(self):
        super().__init__()
        self.puts = 0

    def put_blob(self, data):
        self.puts += 1
        return super().put_blob(data)


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    if request.param == "memory":
        yield CountingStore()
        return
    store_mod = pytest.importorskip("tttr.sessions.store")
    s = store_mod.Store.open(tmp_path / "s.db", create=True)
    yield s
    s.close()


def test_snapshot_restore_round_trip(tmp_path, store):
    src = _tree(tmp_path / "src")
    digest = snapshot(src, store)
    assert digest == tree_digest(src)
    dest = restore(digest, store, tmp_path / "dest")
    assert tree_digest(dest) == digest
    assert (dest / "a" / "b" / "deep.txt").read_text() == "deep\n"
    assert os.readlink(dest / "link") == "one.txt"
    assert os.stat(dest / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(dest / "one.txt").st_mtime_ns == 1_700_000_000_000_000_000
    assert (dest / "empty").is_dir()


def test_each_content_is_stored_once(tmp_path):
    store = CountingStore()
    src = _tree(tmp_path / "src")
    snapshot(src, store)
    # one.txt and two.txt share content: 3 distinct file contents + 1 manifest
    assert store.puts == 4
    store.puts = 0
    (src / "three.txt").write_text("same\n")
    d2 = snapshot(src, store)
    assert store.puts == 1  # only the new manifest
    added = diff_manifests(store, None, d2)
    assert {c.change for c in added} == {"added"} and "three.txt" in {c.path for c in added}
    assert [e.path for e in read_manifest(d2, store) if e.kind == "f"] == [
        "a/b/deep.txt", "one.txt", "run.sh", "three.txt", "two.txt"]


def test_digest_sees_every_change(tmp_path):
    src = _tree(tmp_path / "src")
    d0 = tree_digest(src)
    time.sleep(0.06)
    assert tree_digest(src) == d0
    # same size, same mtime: only content (and ctime) differ; the stat cache must notice
    st = os.stat(src / "one.txt")
    (src / "one.txt").write_text("SAME\n")
    os.utime(src / "one.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    d1 = tree_digest(src)
    assert d1 != d0
    os.chmod(src / "two.txt", 0o600)
    assert tree_digest(src) not in (d0, d1)


def test_restore_refuses_unsafe_or_busy_targets(tmp_path):
    store = MemoryStore()
    src = _tree(tmp_path / "src")
    digest = snapshot(src, store)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(SnapshotError, match="not an empty directory"):
        restore(digest, store, busy)
    evil = store.put_blob(b'{"format":"tttr-tree/1","entries":[[".","d",493,0,0,""],["../escape","f",420,0,1,"00"]]}')
    with pytest.raises(SnapshotError, match="unsafe path"):
        restore(evil, store, tmp_path / "e1")
    via_link = store.put_blob(
        b'{"format":"tttr-tree/1","entries":[[".","d",493,0,0,""],["l","l",511,0,4,"/etc"],["l/passwd","f",420,0,1,"00"]]}')
    with pytest.raises(SnapshotError, match="no directory parent"):
        restore(via_link, store, tmp_path / "e2")
    with pytest.raises(SnapshotError):
        restore("0" * 64, store, tmp_path / "e3")
    assert exit_code_of(SnapshotError) == 2


def exit_code_of(cls):
    return cls.exit_code


def test_thousand_file_tree_snapshot_and_restore(tmp_path):
    from tttr.engine.bench.sandbox import make_tree

    store = MemoryStore()
    src = tmp_path / "big"
    src.mkdir()
    paths = make_tree(src)
    d1 = snapshot(src, store)
    for p in paths[:10]:
        p.write_text("changed\n")
    d2 = snapshot(src, store)
    assert [c.change for c in diff_manifests(store, d1, d2)] == ["changed"] * 10
    restore(d2, store, tmp_path / "r")
    assert tree_digest(tmp_path / "r") == d2
