"""Content-addressed snapshots of a task tree.

A tree is described by a manifest: one entry per directory, file and symlink with its
path, kind, permission bits, mtime and content reference. Each file's bytes are stored
once, by hash, through `store.put_blob`; the manifest itself is a blob, and its digest
names the tree. `tree_digest(tree)` computes that same digest without a store, fast
thanks to a stat cache, so "did this command change the tree" is one comparison.
Ownership, inode numbers, atime and ctime are not part of a tree.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tttr.recorders.errors import SnapshotError

FORMAT = "tttr-tree/1"
RACY_NS = 50_000_000   # a file changed this close to its hashing is hashed again next time


class BlobStore(Protocol):
    def put_blob(self, data: bytes) -> str: ...
    def get_blob(self, digest: str) -> bytes: ...
    def has_blob(self, digest: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Entry:
    path: str        # relative, "/"-separated; "." is the tree itself
    kind: str        # "d" directory, "f" file, "l" symlink
    mode: int        # permission bits
    mtime_ns: int
    size: int
    ref: str         # sha256 of a file's bytes, a symlink's target, "" for a directory

    def row(self) -> list:
        return [self.path, self.kind, self.mode, self.mtime_ns, self.size, self.ref]


# path -> (size, mtime_ns, ctime_ns, ino, digest, hashed_at_ns)
_stat_cache: dict[str, tuple[int, int, int, int, str, int]] = {}
# store -> digests known to be in it (saves a has_blob query per unchanged file)
_known: "weakref.WeakKeyDictionary[object, set[str]]" = weakref.WeakKeyDictionary()


def _file_digest(path: str, st: os.stat_result) -> str:
    hit = _stat_cache.get(path)
    if hit is not None and hit[:4] == (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) \
            and st.st_ctime_ns + RACY_NS < hit[5]:
        return hit[4]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    digest = h.hexdigest()
    _stat_cache[path] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, digest, time.time_ns())
    return digest


def scan(tree: Path | str) -> list[Entry]:
    """The tree's entries, sorted by path. Sockets, FIFOs and devices are left out."""
    root = os.path.abspath(tree)
    if not os.path.isdir(root):
        raise SnapshotError(f"tree {str(tree)!r} is not a directory")
    st = os.lstat(root)
    entries = [Entry(".", "d", stat.S_IMODE(st.st_mode), st.st_mtime_ns, 0, "")]

    def walk(abs_dir: str, rel_dir: str) -> None:
        try:
            it = os.scandir(abs_dir)
        except OSError as exc:
            raise SnapshotError(f"cannot read directory {abs_dir!r}: {exc.strerror}") from None
        with it:
            items = sorted(it, key=lambda e: e.name)
        for e in items:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            st = e.stat(follow_symlinks=False)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                entries.append(Entry(rel, "d", mode, st.st_mtime_ns, 0, ""))
                walk(e.path, rel)
            elif stat.S_ISREG(st.st_mode):
                try:
                    digest = _file_digest(e.path, st)
                except OSError as exc:
                    raise SnapshotError(f"cannot read file {e.path!r}: {exc.strerror}") from None
                entries.append(Entry(rel, "f", mode, st.st_mtime_ns, st.st_size, digest))
            elif stat.S_ISLNK(st.st_mode):
                target = os.readlink(e.path)
                entries.append(Entry(rel, "l", 0o777, st.st_mtime_ns, len(os.fsencode(target)), target))

    walk(root, "")
    return entries


def manifest_bytes(entries: list[Entry]) -> bytes:
    doc = {"format": FORMAT, "entries": [e.row() for e in entries]}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode()


def tree_digest(tree: Path | str) -> str:
    """The digest `snapshot` would return for this tree, without storing anything."""
    return hashlib.sha256(manifest_bytes(scan(tree))).hexdigest()


def snapshot(tree: Path | str, store: BlobStore) -> str:
    """Store the tree's files (each once, by hash) and its manifest; return the manifest digest."""
    entries = scan(tree)
    try:
        known = _known.setdefault(store, set())
    except TypeError:  # a store that cannot be weakly referenced: no cache
        known = set()
    root = os.path.abspath(tree)
    for i, e in enumerate(entries):
        if e.kind != "f" or e.ref in known:
            continue
        if not store.has_blob(e.ref):
            with open(os.path.join(root, e.path), "rb") as f:
                data = f.read()
            stored = store.put_blob(data)
            if stored != e.ref:  # changed while we read it: record what was stored
                entries[i] = Entry(e.path, "f", e.mode, e.mtime_ns, len(data), stored)
            known.add(stored)
        known.add(e.ref)
    return store.put_blob(manifest_bytes(entries))


def read_manifest(digest: str, store: BlobStore) -> list[Entry]:
    try:
        doc = json.loads(store.get_blob(digest))
    except Exception as exc:  # noqa: BLE001 - any store's failure (SQLite, a missing blob) is this file's problem - missing blob or not JSON: both mean "no such tree"
        raise SnapshotError(f"no tree manifest {digest!r} in the store ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SnapshotError(f"blob {digest!r} is not a tree manifest ({FORMAT})")
    out = []
    for row in doc.get("entries", []):
        try:
            e = Entry(*row)
        except TypeError:
            raise SnapshotError(f"bad manifest entry {row!r} in {digest!r}") from None
        _check_path(e.path, digest)
        if e.kind not in ("d", "f", "l"):
            raise SnapshotError(f"bad entry kind {e.kind!r} for {e.path!r} in {digest!r}")
        out.append(e)
    return out


def _check_path(path: str, digest: str) -> None:
    parts = path.split("/")
    if path != "." and (path.startswith("/") or any(p in ("", ".", "..") for p in parts)):
        raise SnapshotError(f"unsafe path {path!r} in manifest {digest!r}")


def restore(digest: str, store: BlobStore, dest: Path | str) -> Path:
    """Rebuild the tree named by `digest` in `dest` (absent or an empty directory)."""
    entries = read_manifest(digest, store)
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise SnapshotError(f"restore target {str(dest)!r} is not an empty directory: give a fresh one")
    dest.mkdir(parents=True, exist_ok=True)
    root = str(dest.resolve())
    dirs = {"."}
    for e in entries:
        if e.kind == "d" and e.path != ".":
            parent = e.path.rpartition("/")[0] or "."
            if parent not in dirs:
                raise SnapshotError(f"directory {e.path!r} comes before its parent in {digest!r}")
            os.mkdir(os.path.join(root, e.path), 0o700)
            dirs.add(e.path)
    blobs: dict[str, bytes] = {}
    for e in entries:
        if e.kind == "d":
            continue
        parent = e.path.rpartition("/")[0] or "."
        if parent not in dirs:  # a parent that is a symlink or missing would let a write escape
            raise SnapshotError(f"{e.path!r} has no directory parent in {digest!r}")
        full = os.path.join(root, e.path)
        if e.kind == "l":
            continue
        data = blobs.get(e.ref)
        if data is None:
            try:
                data = store.get_blob(e.ref)
            except Exception as exc:  # noqa: BLE001
                raise SnapshotError(f"file {e.path!r}: blob {e.ref} missing from the store ({exc})") from None
            blobs[e.ref] = data
        fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            _write_all(fd, data)
            os.fchmod(fd, e.mode)
            os.utime(fd, ns=(e.mtime_ns, e.mtime_ns))
        finally:
            os.close(fd)
    for e in entries:  # symlinks last, so nothing is ever written through one
        if e.kind == "l":
            full = os.path.join(root, e.path)
            os.symlink(e.ref, full)
            os.utime(full, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)
    for e in sorted((e for e in entries if e.kind == "d"), key=lambda e: e.path.count("/"), reverse=True):
        full = root if e.path == "." else os.path.join(root, e.path)
        os.chmod(full, e.mode)
        os.utime(full, ns=(e.mtime_ns, e.mtime_ns))
    return dest


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def diff_trees(a: str | None, b: str, store: BlobStore) -> dict[str, list[str]]:
    """Paths added, removed and changed (content, mode, mtime or kind) from tree a to b."""
    old = {e.path: e for e in read_manifest(a, store)} if a else {}
    new = {e.path: e for e in read_manifest(b, store)}
    return {
        "added": sorted(p for p in new if p not in old),
        "removed": sorted(p for p in old if p not in new),
        "changed": sorted(p for p in new if p in old and new[p] != old[p] and p != "."),
    }
