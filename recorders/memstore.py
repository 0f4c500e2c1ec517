"""A blob store in memory with the session store's blob methods: for tests, benchmarks
and `tttr sandbox` commands that need snapshots without a database."""

from __future__ import annotations

import hashlib


class MemoryStore:
    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}

    def put_blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        self.blobs.setdefault(digest, bytes(data))
        return digest

    def get_blob(self, digest: str) -> bytes:
        try:
            return self.blobs[digest]
        except KeyError:
            raise KeyError(f"no blob {digest}") from None

    def has_blob(self, digest: str) -> bool:
        return digest in self.blobs
