"""Content-addressed blobs: large values (tool output, file contents, full logits, snapshot
manifests) stored once under the sha256 of their bytes, zlib-compressed unless that would
not shrink them. An event's value refers to one as {"$blob": digest, "size": bytes}."""

from __future__ import annotations

import hashlib
import sqlite3
import zlib
from pathlib import Path

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


def get(conn: sqlite3.Connection, digest: str, path: Path) -> bytes:
    row = conn.execute("SELECT codec, data FROM blobs WHERE digest = ?", (digest,)).fetchone()
    if row is None:
        raise StoreError(f"no blob {digest} in {path}; the value refers to content that was never stored")
    codec, stored = row
    if codec not in ("zlib", "raw"):
        raise StoreError(f"blob {digest} in {path} has unknown codec {codec!r}; it needs a newer tttr")
    data = zlib.decompress(stored) if codec == "zlib" else bytes(stored)
    if hashlib.sha256(data).hexdigest() != digest:
        raise StoreError(f"blob {digest} in {path} does not match its digest; the file is damaged, restore it from a copy")
    return data


def has(conn: sqlite3.Connection, digest: str) -> bool:
    return conn.execute("SELECT 1 FROM blobs WHERE digest = ?", (digest,)).fetchone() is not None
