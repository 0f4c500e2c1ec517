"""A stable id for a model: its name plus a short hash of its content. Hashing ~100 MB
costs a fraction of a second, so the hash is cached by (path, size, mtime)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tttr.sessions.cache import cache_dir

_CHUNK = 1 << 20
_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")


def _cache_file() -> Path:
    return cache_dir() / "model_ids.json"


def _content_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = [path / n for n in _FILES if (path / n).is_file()]
    return files + sorted(path.glob("*.safetensors"))


def content_hash(path: Path) -> str:
    """blake2b over the model's files (name-independent), hex."""
    path = path.resolve()
    files = _content_files(path)
    key = json.dumps([[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files])
    cache_path = _cache_file()
    try:
        cache = json.loads(cache_path.read_text())
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache, dict) and key in cache:
        return cache[key]
    h = hashlib.blake2b(digest_size=16)
    for f in files:
        h.update(f.name.encode() if f != path else b"")
        with open(f, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    digest = h.hexdigest()
    try:
        cache = cache if isinstance(cache, dict) else {}
        cache[key] = digest
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, cache_path)
    except OSError:
        pass  # an unwritable cache only costs a re-hash next time
    return digest


def model_id(path: Path, name: str) -> str:
    return f"{name}-{content_hash(path)[:12]}"
