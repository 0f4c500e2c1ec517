"""Content-addressed blobs: large values (tool output, file contents, full logits, snapshot
manifests) stored once under the sha256 of their bytes, zlib-compressed unless that would
not shrink them. An event's value refers to one as {"$blob": digest, "size": bytes}."""

from __future__ import annotations

import hashlib
import re
import sqlite3
import zlib
from pathlib import Path
from typing import Any, NamedTuple

from .errors import StoreError


def put(conn: sqlite3.Connection, data: bytes) -> str:
    data = bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    if has(conn, digest):
        return digest
    packed = zlib.compress(data, 6)
    codec, stored = ("zlib", packed) if len(packed) < len(data) else ("raw", data)
    conn.execute(
        "INSERT OR IGNORE INTO blobs (digest, size, codec, data) VALUES (?,?,?,?)",
        (digest, len(data), codec, stored),
    )
    return digest


MAX_BYTES = 64 << 20  # a blob that expands beyond this is refused (or cut, for display)


class BlobPart(NamedTuple):
    """What `get_part` read: the blob's first bytes, and whether that is all of it."""

    data: bytes
    complete: bool
    size: int | None  # the size the file claims for it (untrusted), for "… of N bytes"

    @property
    def truncated(self) -> bool:
        return not self.complete


def _row(conn: sqlite3.Connection, digest: str, path: Path) -> tuple[str, bytes, Any]:
    if type(digest) is not str or len(digest) > 128:
        raise StoreError(f"bad blob reference {str(digest)[:80]!r}: a blob is named by its sha256 hex digest")
    row = conn.execute("SELECT codec, data, size FROM blobs WHERE digest = ?", (digest,)).fetchone()
    if row is None:
        raise StoreError(f"no blob {digest} in {path}; the value refers to content that was never stored")
    codec, stored, size = row
    if codec not in ("zlib", "raw"):
        raise StoreError(f"blob {digest} in {path} has unknown codec {str(codec)[:40]!r}; it needs a newer tttr")
    if not isinstance(stored, bytes):
        stored = stored.encode("utf-8", "surrogateescape") if isinstance(stored, str) else b""
    return codec, stored, size if type(size) is int else None


def _inflate(stored: bytes, limit: int, digest: str, path: Path) -> tuple[bytes, bool]:
    """At most `limit` bytes of the decompressed blob, and whether that was all of it; never
    more than limit + 1 bytes are produced, whatever the stream claims."""
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(stored, limit + 1)
    except zlib.error as exc:
        raise StoreError(f"blob {digest} in {path} cannot be decompressed ({exc}); the file is damaged") from None
    if len(data) > limit:
        return data[:limit], False
    if not inflater.eof:
        raise StoreError(f"blob {digest} in {path} is cut short (its compressed data ends early); the file is damaged")
    return data, True


def get(conn: sqlite3.Connection, digest: str, path: Path, limit: int = MAX_BYTES) -> bytes:
    """The blob's bytes, checked against its digest; StoreError if it expands beyond `limit`."""
    part = get_part(conn, digest, path, limit)
    if not part.complete:
        raise StoreError(
            f"blob {digest} in {path} is larger than {limit:,} bytes when expanded; it is refused as "
            "too large (a damaged or hostile file; pass a larger limit to read it anyway)"
        )
    return part.data


def get_part(conn: sqlite3.Connection, digest: str, path: Path, limit: int) -> BlobPart:
    """For showing a blob: its first `limit` bytes (complete=False when there is more). Only a
    complete blob is checked against its digest."""
    codec, stored, size = _row(conn, digest, path)
    if codec == "zlib":
        data, complete = _inflate(stored, limit, digest, path)
    else:
        data, complete = stored[:limit], len(stored) <= limit
    if complete and hashlib.sha256(data).hexdigest() != digest:
        raise StoreError(f"blob {digest} in {path} does not match its digest; the file is damaged, restore it from a copy")
    return BlobPart(bytes(data), complete, size)


def has(conn: sqlite3.Connection, digest: str) -> bool:
    return conn.execute("SELECT 1 FROM blobs WHERE digest = ?", (digest,)).fetchone() is not None


# -------------------------------------------------------------------- collecting unused blobs
_DIGEST_TEXT = re.compile(r"[0-9a-f]{64}")
_DIGEST_BYTES = re.compile(rb"[0-9a-f]{64}")


class Sweep(NamedTuple):
    """What `sweep` found: blobs no run refers to (removed unless it was a dry run), and the
    ones kept."""

    removed: int
    freed_bytes: int  # their stored (compressed) sizes
    kept: int


def referenced(conn: sqlite3.Connection, path: Path) -> set[str]:
    """Every blob digest the file's runs may refer to, over-approximated so that nothing in
    use is ever taken for unused: any sha256-shaped text in an event's JSON value or in any
    column of a run (a `{"$blob": ...}` reference, a snapshot or tree digest, a value that
    merely looks like one), the digests binary logits records carry, and, transitively,
    the same inside every referenced blob that reads as JSON (a snapshot manifest names its
    files' blobs). A referenced JSON blob that cannot be read raises StoreError: what it
    refers to cannot be known, so nothing is collected."""
    from .codec import peek

    found: set[str] = set()
    for (value,) in conn.execute("SELECT value FROM events"):
        if type(value) is str:
            found.update(_DIGEST_TEXT.findall(value))
        elif type(value) is bytes:
            peeked = peek(value)
            if peeked is not None and peeked[0] == "logits":
                found.add(peeked[1])
    for row in conn.execute("SELECT * FROM runs"):
        for column in row:
            if type(column) is str:
                found.update(_DIGEST_TEXT.findall(column))
    stored = {d for (d,) in conn.execute("SELECT digest FROM blobs") if type(d) is str}
    todo = list(found & stored)
    while todo:
        digest = todo.pop()
        codec, data, _ = _row(conn, digest, path)
        head = data[:2] if codec == "raw" else zlib.decompressobj().decompress(data, 2)
        if head.lstrip()[:1] not in (b"{", b"["):
            continue  # a file's bytes or a text output: refers to nothing
        for ref in _DIGEST_BYTES.findall(get(conn, digest, path)):
            ref = ref.decode()
            if ref in stored and ref not in found:
                found.add(ref)
                todo.append(ref)
    return found


def sweep(conn: sqlite3.Connection, path: Path, *, dry_run: bool = False) -> Sweep:
    """Remove the blobs no run refers to (see `referenced`); the caller holds the write
    lock, so no recorder can store a blob and its reference in between. Rows whose digest
    is not text (a hand-edited file) are kept."""
    keep = referenced(conn, path)
    (total,) = conn.execute("SELECT count(*) FROM blobs").fetchone()
    unused = [(d, n) for d, n in conn.execute("SELECT digest, length(data) FROM blobs")
              if type(d) is str and d not in keep]
    if not dry_run:
        conn.executemany("DELETE FROM blobs WHERE digest = ?", [(d,) for d, _ in unused])
    return Sweep(len(unused), sum(n for _, n in unused if type(n) is int), total - len(unused))
