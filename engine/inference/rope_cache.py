"""The rotary tables a model computed, kept on disk for the torch-free generation path.

`Model` computes its cos/sin tables with PyTorch's vectorised cos and sin, whose bits numpy's
do not match (about 14k of the default model's 262k entries differ here, in float32 or
rounded from float64). So the torch-free path (lite.py) does not compute them: it reads the
tables the model wrote the first time it loaded on this machine, under a key naming
everything they depend on (the torch build, the CPU's flags, the rotary parameters, the
per-frequency factors, the row count). A missing file means the torch path runs once."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import numpy as np

from tttr.sessions.cache import _cpu_flags, cache_dir

TABLE_ROWS = 4096  # the table a model makes at load: min(context, TABLE_ROWS) rows (grown when a pass needs more)


def _torch_build() -> bytes:
    """torch's version file, found without importing torch ("" when torch is not installed)."""
    try:
        spec = importlib.util.find_spec("torch")
        locations = spec.submodule_search_locations if spec is not None else None
        return (Path(next(iter(locations))) / "version.py").read_bytes() if locations else b""
    except (ImportError, ValueError, OSError, StopIteration):
        return b""


def table_key(config, freq_factors: np.ndarray | None, rows: int) -> str:
    """The cache key of a model's tables: config (a ModelConfig), its rope_freqs as fp32 (or
    None), the table's row count."""
    h = hashlib.blake2b(digest_size=16, person=b"tttr-rope")
    for part in (_torch_build(), _cpu_flags().encode(), repr((config.rope_theta, config.head_dim, config.rope_scaling,
                                                              rows)).encode()):
        h.update(len(part).to_bytes(8, "little") + part)
    h.update(b"-" if freq_factors is None else np.ascontiguousarray(freq_factors, dtype=np.float32).tobytes())
    return h.hexdigest()


def _path(key: str) -> Path:
    return cache_dir() / "rope" / f"{key}.npy"


def load_tables(key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(cos, sin) fp32 [rows, head_dim] as the model computed them, or None when not stored."""
    try:
        both = np.load(_path(key))
    except (OSError, ValueError):
        return None
    if both.ndim != 3 or both.shape[0] != 2 or both.dtype != np.float32:
        return None
    return np.ascontiguousarray(both[0]), np.ascontiguousarray(both[1])


def store_tables(key: str, cos: np.ndarray, sin: np.ndarray) -> None:
    """Keep the tables under `key` (once: an existing file is left alone; a failure to write
    only means the torch path runs next time)."""
    path = _path(key)
    if path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, np.stack([cos, sin]).astype(np.float32, copy=False))
        os.replace(tmp, path)
    except OSError:
        pass
