"""TTTR's cache directory, and C shared libraries built there with the system compiler on
first use (the kernels' compiled row-invariant GEMM, quantized GEMV and attention; the
sandbox's launcher and randomness shim). It sits in the lowest package because both
kernels and recorders use it. No torch: importing this is cheap."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path


def cache_dir() -> Path:
    """$TTTR_CACHE, else $XDG_CACHE_HOME/tttr, else ~/.cache/tttr (created)."""
    base = os.environ.get("TTTR_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tttr"
    )
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return ""


_LOCAL_INCLUDE = re.compile(r'^#include "([^"/]+)"\n', re.MULTILINE)


def c_source(path: Path) -> str:
    """The C file at `path` as the one text the compiler is handed: each `#include "name"` line
    replaced by the text of the file `name` beside it (recursively). So `build_shared`'s key
    covers every part, and the compiler needs no include path into the package. The files
    ship as package data beside the modules that build them."""
    return _LOCAL_INCLUDE.sub(lambda m: c_source(path.with_name(m.group(1))), path.read_text())


def build_shared(stem: str, source: str, flags: list[str], what: str,
                 subdir: str = "") -> tuple[Path | None, str | None]:
    """(path of the compiled library, None) or (None, one line saying why it could not be
    built). The file is named after the source, the flags and the compiler (and this CPU's
    flags when compiled for it), so a change to any of them builds anew; concurrent
    builders agree through an atomic rename."""
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
    if not cc:
        return None, f"no C compiler (gcc/cc/clang) to build {what}; install gcc"
    parts = [source, *flags, cc, os.path.realpath(cc)]
    if "-march=native" in flags:
        parts.append(_cpu_flags())
    key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    folder = cache_dir() / subdir if subdir else cache_dir()
    target = folder / f"{stem}-{key}.so"
    if target.exists():
        return target, None
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        src, out = Path(tmp) / f"{stem}.c", Path(tmp) / f"{stem}.so"
        src.write_text(source)
        proc = subprocess.run([cc, *flags, "-o", str(out), str(src)], capture_output=True, text=True)
        if proc.returncode != 0:
            first = (proc.stderr.strip().splitlines() or ["?"])[0]
            return None, f"building {what} with {cc} failed: {first}"
        os.replace(out, target)
    return target, None


class CLibrary:
    """One of TTTR's compiled kernels: C source built on first use (`build_shared`, under the
    cache's `kernels/`), loaded with ctypes, its functions declared by `declare(lib)`. Built
    once per process, from any thread. `TTTR_NO_C_KERNELS=1` switches every one of them off;
    without a compiler `load()` is None and `why_unavailable()` says why in one line."""

    def __init__(self, stem: str, source: str, flags: list[str], what: str, declare) -> None:
        self.stem, self.source, self.flags, self.what, self._declare = stem, source, flags, what, declare
        self._lock = threading.Lock()
        self._lib = None
        self._why: str | None = None
        self._tried = False

    def _build(self):
        if os.environ.get("TTTR_NO_C_KERNELS"):
            return None, "TTTR_NO_C_KERNELS is set"
        target, why = build_shared(self.stem, self.source, self.flags, self.what, subdir="kernels")
        if target is None:
            return None, why
        lib = ctypes.CDLL(str(target))
        self._declare(lib)
        return lib, None

    def load(self):
        """The ctypes library, or None."""
        if not self._tried:
            with self._lock:
                if not self._tried:
                    try:
                        self._lib, self._why = self._build()
                    except OSError as exc:
                        self._lib, self._why = None, f"loading {self.what} failed: {exc}"
                    self._tried = True
        return self._lib

    def available(self) -> bool:
        return self.load() is not None

    def why_unavailable(self) -> str | None:
        self.load()
        return self._why
