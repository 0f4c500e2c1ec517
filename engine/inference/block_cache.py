"""A GGUF file's weights in the kernel's layout (kernels.cquant), packed once and mapped after.

Packing the default model's blocks reads 105 MB from the file and rearranges them (0.2-0.4 s
of a cold start); the torch-free path (lite.py) and the torch path's load (model.py, for files
of MIN_FILE_BYTES or more) instead map the packed bytes kept the first time: one file of every weight's parts and a JSON index of where each one lies, under
the cache directory, keyed by the GGUF file (path, size, mtime) and the packing code. The
mapped pages are the page cache's: a start reads none of them until a product does."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import shutil
from pathlib import Path

import numpy as np

from tttr.kernels import array_ops
from tttr.kernels.array_ops import QuantWeight
from tttr.sessions.cache import cache_dir

_FORMAT = 1  # bump when what is stored changes
_ALIGN = 4096
MIN_FILE_BYTES = 8 << 20  # smaller files pack in milliseconds: not worth a folder in the cache


def _folder(path: Path) -> Path:
    st = path.stat()
    h = hashlib.blake2b(digest_size=12, person=b"tttr-blocks")
    h.update(f"{_FORMAT}\0{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{array_ops.LAYOUT_KEY}".encode())
    return cache_dir() / "blocks" / f"{path.stem}-{h.hexdigest()}"


class BlockCache:
    """`weight(names)`: the block weight of those tensors' rows (cquant.block_weights of
    `quantized[name]` each), from the mapped file when it was kept, else packed now; `save()`
    keeps what was packed for the next start."""

    def __init__(self, path: Path, quantized):
        self.quantized = quantized
        self.folder = _folder(path)
        self.index: dict | None = None
        self.packed: dict[str, QuantWeight | None] = {}
        try:
            index = json.loads((self.folder / "index.json").read_text())
            with open(self.folder / "blocks.bin", "rb") as f:
                self.mapped = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
            self.index = index
        except (OSError, ValueError):
            self.index = None

    @classmethod
    def for_file(cls, path: Path, quantized) -> BlockCache | None:
        """The cache of GGUF file `path` for a model loaded from it (engine/inference/model.py),
        or None for what is not such a file or is too small to be worth keeping."""
        path = Path(path)
        try:
            if not path.is_file() or path.suffix.lower() != ".gguf" or path.stat().st_size < MIN_FILE_BYTES:
                return None
        except OSError:
            return None
        return cls(path, quantized)

    def weight(self, names: list[str]) -> QuantWeight | None:
        key = "+".join(names)
        if self.index is not None and key in self.index:
            parts = self.index[key]
            if parts is None:
                return None
            return array_ops.weight_from_parts([(fmt, self.mapped[off:off + int(np.prod(shape))].reshape(shape))
                                                for fmt, off, shape in parts])
        qw = None
        if all(n in self.quantized for n in names):
            qw = array_ops.block_weights([self.quantized[n] for n in names])
        self.packed[key] = qw
        return qw

    def save(self) -> None:
        """Write what `weight` packed (when nothing was mapped): a failure only costs a pack next time."""
        if self.index is not None or not self.packed:
            return
        tmp = self.folder.with_name(f"{self.folder.name}.{os.getpid()}.tmp")
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            index: dict[str, list | None] = {}
            with open(tmp / "blocks.bin", "wb") as f:
                for key, qw in self.packed.items():
                    if qw is None:
                        index[key] = None
                        continue
                    entry = []
                    for fmt, data in array_ops.weight_parts(qw):
                        f.seek(-f.tell() % _ALIGN, os.SEEK_CUR)
                        entry.append([fmt, f.tell(), list(data.shape)])
                        f.write(np.ascontiguousarray(data).tobytes())
                    index[key] = entry
            (tmp / "index.json").write_text(json.dumps(index))
            os.replace(tmp, self.folder)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
