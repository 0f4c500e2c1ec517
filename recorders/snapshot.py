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

from tttr.recorders import treeio
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


def _cached(key: str, st: os.stat_result) -> str | None:
    hit = _stat_cache.get(key)
    if hit is not None and hit[:4] == (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino) \
            and st.st_ctime_ns + RACY_NS < hit[5]:
        return hit[4]
    return None


def scan(tree: Path | str, store: BlobStore | None = None) -> list[Entry]:
    """The tree's entries, sorted by path. Sockets, FIFOs and devices are left out. With
    `store`, every file's bytes are stored there (once, by hash) as they are read.

    The tree may be a program's, changing as it is read: everything is opened relative to a
    directory descriptor without following links, a file is read only when what was opened
    is a regular file, and at most treeio.MAX_FILE_BYTES of it (recorders/treeio.py)."""
    root = os.path.abspath(tree)
    if not os.path.isdir(root) or os.path.islink(root):
        raise SnapshotError(f"tree {str(tree)!r} is not a directory")
    if store is not None:
        try:
            known = _known.setdefault(store, set())
        except TypeError:  # a store that cannot be weakly referenced: no cache
            known = set()
    with treeio.opened_root(root) as root_fd:
        st = os.fstat(root_fd)
        entries = [Entry(".", "d", stat.S_IMODE(st.st_mode), st.st_mtime_ns, 0, "")]
        for dir_fd, rel, name, st in treeio.walk(root_fd):
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISDIR(st.st_mode):
                entries.append(Entry(rel, "d", mode, st.st_mtime_ns, 0, ""))
            elif stat.S_ISREG(st.st_mode):
                key = f"{root}/{rel}"
                digest = _cached(key, st)
                if digest is not None and (store is None or digest in known or store.has_blob(digest)):
                    if store is not None:
                        known.add(digest)
                    entries.append(Entry(rel, "f", mode, st.st_mtime_ns, st.st_size, digest))
                    continue
                read = treeio.read_regular(dir_fd, name, keep=store is not None, rel=rel)
                if read is None:  # swapped for a link, a FIFO or a device since it was listed
                    continue
                digest, data, size, fst = read
                _stat_cache[key] = (fst.st_size, fst.st_mtime_ns, fst.st_ctime_ns, fst.st_ino, digest, time.time_ns())
                if store is not None and digest not in known:
                    if not store.has_blob(digest):
                        digest = store.put_blob(data)
                    known.add(digest)
                entries.append(Entry(rel, "f", stat.S_IMODE(fst.st_mode), fst.st_mtime_ns, size, digest))
            elif stat.S_ISLNK(st.st_mode):
                try:
                    target = os.readlink(name, dir_fd=dir_fd)
                except OSError:
                    continue
                entries.append(Entry(rel, "l", 0o777, st.st_mtime_ns, len(os.fsencode(target)), target))
    return entries


def manifest_bytes(entries: list[Entry]) -> bytes:
    doc = {"format": FORMAT, "entries": [e.row() for e in entries]}
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode()


def tree_digest(tree: Path | str) -> str:
    """The digest `snapshot` would return for this tree, without storing anything."""
    return hashlib.sha256(manifest_bytes(scan(tree))).hexdigest()


def snapshot(tree: Path | str, store: BlobStore) -> str:
    """Store the tree's files (each once, by hash) and its manifest; return the manifest digest."""
    return store.put_blob(manifest_bytes(scan(tree, store)))


def read_manifest(digest: str, store: BlobStore) -> list[Entry]:
    try:
        doc = json.loads(store.get_blob(digest))
    except Exception as exc:  # noqa: BLE001 - any store's failure (SQLite, a missing blob) is this file's problem - missing blob or not JSON: both mean "no such tree"
        raise SnapshotError(f"no tree manifest {digest!r} in the store ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SnapshotError(f"blob {digest!r} is not a tree manifest ({FORMAT})")
    out = []
    seen: set[str] = set()
    for row in doc.get("entries", []):
        try:
            e = Entry(*row)
        except TypeError:
            raise SnapshotError(f"bad manifest entry {row!r} in {digest!r}") from None
        if not (isinstance(e.path, str) and isinstance(e.kind, str) and isinstance(e.ref, str)
                and all(type(v) is int for v in (e.mode, e.mtime_ns, e.size))):
            raise SnapshotError(f"bad manifest entry {row!r} in {digest!r}: wrong types")
        _check_path(e.path, digest)
        if e.path in seen:
            raise SnapshotError(f"path {e.path!r} is listed twice in manifest {digest!r}")
        seen.add(e.path)
        if e.kind not in ("d", "f", "l"):
            raise SnapshotError(f"bad entry kind {e.kind!r} for {e.path!r} in {digest!r}")
        out.append(e)
    return out


def _check_path(path: str, digest: str) -> None:
    parts = path.split("/")
    if path != "." and (path.startswith("/") or any(p in ("", ".", "..") for p in parts)):
        raise SnapshotError(f"unsafe path {path!r} in manifest {digest!r}")


def restore(digest: str, store: BlobStore, dest: Path | str) -> Path:
    """Rebuild the tree named by `digest` in `dest` (absent or an empty directory).

    Everything is created relative to its parent directory's descriptor, with O_EXCL and
    O_NOFOLLOW (recorders/treeio.py), so a path is resolved once per directory rather than
    once per file, and nothing is ever written through a link."""
    entries = read_manifest(digest, store)
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise SnapshotError(f"restore target {str(dest)!r} is not an empty directory: give a fresh one")
    dest.mkdir(parents=True, exist_ok=True)
    with treeio.opened_root(str(dest.resolve())) as root_fd:
        dirs = treeio.DirCache(root_fd)
        try:
            _restore_into(dirs, entries, store, digest)
        finally:
            dirs.close()
    return dest


def _restore_into(dirs: treeio.DirCache, entries: list[Entry], store: BlobStore, digest: str) -> None:
    made = {"."}
    for e in entries:
        if e.kind == "d" and e.path != ".":
            parent, _, name = e.path.rpartition("/")
            if (parent or ".") not in made:
                raise SnapshotError(f"directory {e.path!r} comes before its parent in {digest!r}")
            os.mkdir(name, 0o700, dir_fd=dirs.get(parent or "."))
            made.add(e.path)
    blobs: dict[str, bytes] = {}
    links = []
    for e in entries:
        if e.kind == "d":
            continue
        parent, _, name = e.path.rpartition("/")
        if (parent or ".") not in made:  # a parent that is a symlink or missing would let a write escape
            raise SnapshotError(f"{e.path!r} has no directory parent in {digest!r}")
        if e.kind == "l":
            links.append(e)
            continue
        data = blobs.get(e.ref)
        if data is None:
            try:
                data = store.get_blob(e.ref)
            except Exception as exc:  # noqa: BLE001
                raise SnapshotError(f"file {e.path!r}: blob {e.ref} missing from the store ({exc})") from None
            blobs[e.ref] = data
        fd = os.open(name, treeio.NEW_FLAGS, 0o600, dir_fd=dirs.get(parent or "."))
        try:
            _write_all(fd, data)
            os.fchmod(fd, e.mode)
            os.utime(fd, ns=(e.mtime_ns, e.mtime_ns))
        finally:
            os.close(fd)
    for e in links:  # symlinks last, so nothing is ever written through one
        parent, _, name = e.path.rpartition("/")
        pfd = dirs.get(parent or ".")
        os.symlink(e.ref, name, dir_fd=pfd)
        treeio.set_time_at(pfd, name, e.mtime_ns)
    for e in sorted((e for e in entries if e.kind == "d"), key=lambda e: e.path.count("/"), reverse=True):
        fd = dirs.get(e.path)
        os.fchmod(fd, e.mode)
        os.utime(fd, ns=(e.mtime_ns, e.mtime_ns))


def place(dirs: treeio.DirCache, e: Entry, store: BlobStore, now: os.stat_result | None) -> bool:
    """Put entry `e` into the tree `dirs` holds, over whatever is at its path (`now`, its
    lstat there): a directory is made where there is none and given its mode, a link or a
    file replaces what was there (a file written under a fresh name, then renamed over it).
    Nothing is followed: the tree may be a program's (recorders/treeio.py). Returns whether
    an entry was written (a directory already there only has its mode set)."""
    parent, _, name = e.path.rpartition("/")
    pfd = dirs.get(parent or ".")
    if e.kind == "d":
        made = now is None or not stat.S_ISDIR(now.st_mode)
        if made:
            dirs.forget(e.path)
            treeio.remove_at(pfd, name)
            os.mkdir(name, 0o700, dir_fd=pfd)
        treeio.chmod_dir_at(pfd, name, e.mode)
        return made
    if now is not None and (e.kind == "l" or stat.S_ISDIR(now.st_mode)):
        dirs.forget(e.path)
        treeio.remove_at(pfd, name)
    if e.kind == "l":
        os.symlink(e.ref, name, dir_fd=pfd)
    else:
        treeio.write_file_at(pfd, name, store.get_blob(e.ref), e.mode)
    return True


def overlay(src: Path | str, dest: Path | str) -> list[str]:
    """Lay the tree `src` over the tree `dest`: each of src's entries replaces what dest
    holds at its path, the rest of dest stays. Returns the paths written. src is read and
    dest written without following a link of either (dest may be a program's tree)."""
    from tttr.recorders.memstore import MemoryStore

    blobs = MemoryStore()
    entries = [e for e in scan(src, blobs) if e.path != "."]
    written = []
    with treeio.opened_root(str(dest)) as root_fd:
        dirs = treeio.DirCache(root_fd)
        try:
            for e in entries:  # scan's order: a directory before what it holds
                parent, _, name = e.path.rpartition("/")
                place(dirs, e, blobs, treeio.lstat_at(dirs.get(parent or "."), name))
                if e.kind != "d":
                    treeio.set_time_at(dirs.get(parent or "."), name, e.mtime_ns)
                written.append(e.path)
        except OSError as exc:
            raise SnapshotError(f"cannot lay {str(src)!r} over the tree: {exc}") from None
        finally:
            dirs.close()
    return written


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
