"""The machine's own limits, measured in the same run as what is compared with them
(`tttr bench engine --synthetic`): memory read bandwidth and the fp32 FMA peak of the cores
used. A decode step that reads every weight once is bounded by the first; a long prefill,
compute-bound, by the second. Both come from kernels/machine.c (compiled on first use) and
are the best of a few repetitions, so a busy machine lowers them as it lowers the engine's
figures measured beside them.

- `bandwidth_gbs`: a streaming read (a sum) over a buffer of `mib` MiB, several times the
  last-level cache, split over `threads` threads;
- `fma_peak_gflops`: independent chains of vector fused multiply-adds on each of `threads`
  threads (2 flops per lane per FMA), the widest vectors the build targets (AVX-512 or AVX2).

No torch: numpy buffers through ctypes."""

from __future__ import annotations

import ctypes
import time
from pathlib import Path

import numpy as np

from tttr.sessions.cache import CLibrary, c_source

SOURCE = c_source(Path(__file__).with_name("machine.c"))
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=fast", "-shared", "-fPIC"]


def _declare(lib) -> None:
    lib.tttr_stream_read.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    lib.tttr_stream_read.restype = ctypes.c_double
    lib.tttr_fma_peak.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.c_float]
    lib.tttr_fma_peak.restype = ctypes.c_double
    lib.tttr_fma_lanes.restype = lib.tttr_fma_chains.restype = ctypes.c_int


_library = CLibrary("machine", SOURCE, _FLAGS, "the machine-limit probes", _declare)
available, why_unavailable = _library.available, _library.why_unavailable


def _best(fn, repeats: int) -> float:
    fn()  # warm-up: page faults, thread start, clocks
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def bandwidth_gbs(threads: int, mib: int = 512, repeats: int = 5) -> float:
    """Best streaming-read bandwidth in GB/s (10^9 bytes) over a `mib` MiB buffer."""
    lib = _library.load()
    buf = np.ones(mib * 2**20 // 4, dtype=np.float32)
    seconds = _best(lambda: lib.tttr_stream_read(buf.ctypes.data, buf.size, threads), repeats)
    return buf.nbytes / seconds / 1e9


def fma_peak_gflops(threads: int, iters: int = 20_000_000, repeats: int = 3) -> float:
    """Best fp32 FMA throughput in GFLOP/s on `threads` threads."""
    lib = _library.load()
    seconds = _best(lambda: lib.tttr_fma_peak(iters, threads, 1.0), repeats)
    flops = threads * iters * lib.tttr_fma_chains() * lib.tttr_fma_lanes() * 2
    return flops / seconds / 1e9


def limits(threads: int) -> dict:
    """{"bandwidth_gbs", "fma_peak_gflops", "threads"}, or {"unavailable": why} without a compiler."""
    if not available():
        return {"unavailable": why_unavailable(), "threads": threads}
    return {"bandwidth_gbs": round(bandwidth_gbs(threads), 2), "fma_peak_gflops": round(fma_peak_gflops(threads), 1),
            "threads": threads}
