"""Matrix products straight from a GGUF file's quantized blocks, compiled C (built on first use
with the system compiler, cached, called through ctypes), for both kernel modes.

A GGUF weight stored as Q4_1 (w = d*q + m, q in 0..15, d and m fp16 per 32 inputs), Q8_0
(w = d*q, q in -128..127), Q5_0, or the K-quants Q4_K, Q5_K, Q6_K (256-input super-blocks
with a scale per 32 or 16 inputs) holds the same values the fp32 copy holds, in 4.5 to 8.5
bits a weight instead of 32: the default model's 538 MB of fp32 products read 110 MB
instead, which stays in the last-level cache from one decode step to the next. Each weight is
expanded to exactly the fp32 value `gguf.quants.dequantize` gives (kquants.py says how for
each type: every product there is exact in fp32, so fma(d, q, m) rounds once, as gguf's
d*q + m does) and multiplied in fp32: the same arithmetic on the same values as a dense fp32
product, in a summation order of its own. A weight's rows may be parts stored in different
types (a fused q/k/v of Q4_K and Q6_K): each group of rows is read in its own layout.

Layout, made once per weight (`pack`, kquants.py): output rows in groups of 16, one vector
lane per row; per group and 32-input block, the 16 rows' scales (and minimums), then the
quants input by input (Q4_K, Q6_K: per group and 256-input super-block, the file's scales kept
apart and multiplied out per block in registers, the same exact values). Output row n, input row r sums its products in one fixed order:

    acc_even = sum over even k (k = 0, 2, 4, ...) of x[r, k] * w[n, k], fused multiply-adds in order
    acc_odd  = the same over odd k
    out[r, n] = acc_even + acc_odd

That order depends on nothing but K: not on how many rows share the call (they are taken 8
at a time, each with its own accumulators), not on the row's place, not on the thread count
(each group of 16 outputs is one thread's). So the product is batch-invariant as it stands,
and serves the `invariant` mode as well as `fast`. The AVX-512, AVX2 and plain C bodies
compute the same fused multiply-adds in the same order, so they agree bit for bit.

`TTTR_NO_C_KERNELS=1` or no compiler: `available()` is False and the model keeps its fp32
products (the fingerprint's `linear_kernel` says which ran)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tttr.kernels.kquants import BLOCK, FORMATS as _FORMATS, GROUP, LAYOUT_BYTES, SUPER_LAYOUTS
from tttr.sessions.cache import CLibrary, c_source

if TYPE_CHECKING:  # the wrappers import torch when called: the torch-free path never does
    import torch

FORMATS = tuple(_FORMATS)  # the GGUF types whose blocks the products take (kquants.FORMATS)

SOURCE = c_source(Path(__file__).with_name("cquant.c"))  # with kquants.h, the packer

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-fast-math", "-ffp-contract=off", "-shared", "-fPIC"]


def _declare(lib) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.tttr_qlinear.argtypes = [ctypes.c_int, p, i, i, p, i, p, ctypes.c_int]
    lib.tttr_qlinear.restype = ctypes.c_int
    lib.tttr_qlinear_parts.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_int64), i, p, i, p, ctypes.c_int]
    lib.tttr_qlinear_parts.restype = ctypes.c_int
    lib.tttr_qlinear_kernel.restype = ctypes.c_char_p
    lib.tttr_qpack.argtypes = [ctypes.c_int, p, i, i, i, p]
    lib.tttr_qpack.restype = ctypes.c_int


_library = CLibrary("qlinear", SOURCE, _FLAGS, "the compiled quantized-block products", _declare)
load, available, why_unavailable = _library.load, _library.available, _library.why_unavailable


def kernel_name() -> str | None:
    """"avx512", "avx2" or "c" (the same bits from each), None when not built."""
    lib = load()
    return None if lib is None else lib.tttr_qlinear_kernel().decode()


def block_shape(fmt: str, raw: np.ndarray) -> tuple[int, int]:
    """[N, K] of the weight whose GGUF rows `raw` ([N, bytes] uint8) hold, for a format in FORMATS
    ((0, 0) for another)."""
    if fmt not in _FORMATS:
        return (0, 0)
    _, inputs, nbytes = _FORMATS[fmt]
    return raw.shape[0], raw.shape[1] // nbytes * inputs


def supports(fmt: str, n: int, k: int) -> bool:
    """Whether a weight of n rows and k inputs stored as `fmt` fits the kernel: whole groups
    of 16 rows, whole GGUF blocks (256 inputs for the K-quants)."""
    return fmt in _FORMATS and n > 0 and k > 0 and n % GROUP == 0 and k % _FORMATS[fmt][1] == 0


@dataclass(frozen=True, eq=False)
class Part:
    """Rows of a weight stored as one GGUF type, in its layout (kquants.py)."""

    fmt: str  # the GGUF type the file stored them as
    data: np.ndarray  # uint8, [n / 16, K / 32, LAYOUT_BYTES[layout]]

    @property
    def layout(self) -> int:
        return _FORMATS[self.fmt][0]

    @property
    def n(self) -> int:
        return self.data.shape[0] * GROUP

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` (of this part) as fp32 [R, K]: the layout's expansion (kquants.py), d * q
        exact in fp32 and one rounding for + B, as gguf computes them."""
        ng, nb, _ = self.data.shape
        g, lane, layout = ids // GROUP, ids % GROUP, self.layout
        if layout in SUPER_LAYOUTS:
            return self._super_rows(g, lane)
        a = self.data[:, :, :GROUP * 4].view(np.float32)[g, :, lane][:, :, None]  # [R, nb, 1]
        if layout != 1:
            b = self.data[:, :, GROUP * 4:2 * GROUP * 4].view(np.float32)[g, :, lane][:, :, None]
        if layout == 0:
            pairs = self.data[:, :, 2 * GROUP * 4:].reshape(ng, nb, 16, GROUP)[g, :, :, lane]  # [R, nb, 16]
            q = np.stack([pairs & 15, pairs >> 4], axis=-1).reshape(len(ids), nb, BLOCK).astype(np.float32)
        else:
            off = GROUP * 4 if layout == 1 else 2 * GROUP * 4
            q = self.data[:, :, off:].reshape(ng, nb, BLOCK, GROUP).view(np.int8)[g, :, :, lane].astype(np.float32)
        if layout in (0, 2):
            w = a * q + b
        elif layout == 1:
            w = a * q
        else:  # a scale per 16 inputs
            w = np.concatenate([a * q[:, :, :16], b * q[:, :, 16:]], axis=-1)
        return w.reshape(len(ids), nb * BLOCK)

    def _super_rows(self, g: np.ndarray, lane: np.ndarray) -> np.ndarray:
        """`rows` of layouts 4 and 5 (kquants.h): A and B made from the super-block's scales,
        the same exact products the kernels make."""
        ng, nb, _ = self.data.shape
        sbs = self.data.reshape(ng, nb // 8, -1)[g]  # [R, super-blocks, bytes]
        R, nsb = len(g), nb // 8
        lanes = lane[:, None, None]
        pick = np.arange(R)[:, None, None], np.arange(nsb)[None, :, None]

        def per_lane(lo: int, count: int, dtype) -> np.ndarray:  # [R, nsb, count] of this row's lane
            v = sbs[:, :, lo:lo + count * GROUP * np.dtype(dtype).itemsize].view(dtype).reshape(R, nsb, count, GROUP)
            return v[pick[0], pick[1], np.arange(count)[None, None, :], lanes]

        d = per_lane(0, 1, np.float32)  # [R, nsb, 1]
        if self.layout == 4:
            a = (d * per_lane(8 * GROUP, 8, np.uint8).astype(np.float32))[..., None]  # [R, nsb, 8, 1]
            b = (per_lane(4 * GROUP, 1, np.float32) * per_lane(16 * GROUP, 8, np.uint8).astype(np.float32))[..., None]
            pairs = sbs[:, :, 24 * GROUP:].reshape(R, nsb, 8, 16, GROUP)[pick[0][..., None], pick[1][..., None],
                                                                           np.arange(8)[None, None, :, None],
                                                                           np.arange(16)[None, None, None, :],
                                                                           lanes[..., None]]  # [R, nsb, 8, 16]
            q = np.stack([pairs & 15, pairs >> 4], axis=-1).reshape(R, nsb, 8, BLOCK).astype(np.float32)
            w = a * q + b
        else:
            sc = (d * per_lane(4 * GROUP, 16, np.int8).astype(np.float32)).reshape(R, nsb, 8, 2, 1)
            sub = sbs[:, :, 20 * GROUP:].reshape(R, nsb, 8, 24, GROUP)
            sub = sub[pick[0][..., None], pick[1][..., None], np.arange(8)[None, None, :, None],
                      np.arange(24)[None, None, None, :], lanes[..., None]]  # [R, nsb, 8, 24]
            low, high = sub[..., :16], sub[..., 16:]
            lo = np.stack([low & 15, low >> 4], axis=-1).reshape(R, nsb, 8, BLOCK)
            hi = np.stack([(high >> (2 * i)) & 3 for i in range(4)], axis=-1).reshape(R, nsb, 8, BLOCK)
            q = ((lo | (hi << 4)).astype(np.int32) - 32).astype(np.float32).reshape(R, nsb, 8, 2, 16)
            w = sc * q
        return w.reshape(R, nb * BLOCK)


@dataclass(frozen=True, eq=False)
class QuantWeight:
    """A weight held only as its blocks, in the kernel's layouts: what the model keeps in place
    of an fp32 [N, K] tensor (`shape`). Its rows are one part or several stacked (a fused
    q/k/v whose parts the file stored in different types); products run from all of them in
    one call (`linear`); `rows` and `dense` expand rows to the exact fp32 values
    `gguf.quants.dequantize` gives, for the embedding lookup and any dense product asked of it."""

    parts: tuple[Part, ...]
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        n = len(self.parts)
        # the kernel's arguments, made once: part layouts, data pointers, row counts
        object.__setattr__(self, "_call", (n, (ctypes.c_int * n)(*(p.layout for p in self.parts)),
                                           (ctypes.c_void_p * n)(*(p.data.ctypes.data for p in self.parts)),
                                           (ctypes.c_int64 * n)(*(p.n for p in self.parts))))

    @property
    def fmt(self) -> str:
        """The GGUF type of its blocks ("Q4_K"), or of each part where they differ ("Q4_K+Q6_K")."""
        return "+".join(dict.fromkeys(p.fmt for p in self.parts))

    @property
    def nbytes(self) -> int:
        return sum(p.data.nbytes for p in self.parts)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (int64 [R]) as fp32 [R, K], gguf's values."""
        import torch

        return torch.from_numpy(self.rows_array(ids.numpy() if isinstance(ids, torch.Tensor) else ids))

    def rows_array(self, ids) -> np.ndarray:
        """`rows` as a numpy array, ids any int64 sequence (no torch)."""
        ids = np.asarray(ids, dtype=np.int64)
        if len(self.parts) == 1:
            return self.parts[0].rows(ids)
        out = np.empty((len(ids), self.shape[1]), np.float32)
        first = 0
        for part in self.parts:
            mine = (ids >= first) & (ids < first + part.n)
            if mine.any():
                out[mine] = part.rows(ids[mine] - first)
            first += part.n
        return out

    def dense(self) -> torch.Tensor:
        """The whole weight as fp32 [N, K] (a new tensor each call: the caller keeps it or not)."""
        return self.rows(np.arange(self.shape[0], dtype=np.int64))


def pack_part(fmt: str, raw: np.ndarray, n: int, k: int) -> Part:
    """`raw`: the GGUF tensor's bytes as rows, [n, k / block inputs * block bytes] uint8 (what
    `GGUFReader` gives, rows permuted or concatenated as the fp32 weight's were), rearranged
    into its layout by the compiled `tttr_qpack` (one pass over the bytes, no fp32 anywhere)."""
    if not supports(fmt, n, k):
        raise ValueError(f"cannot pack a {fmt} weight of shape {n}x{k} (needs a format in {', '.join(FORMATS)}, "
                         f"rows % {GROUP} and inputs % {_FORMATS[fmt][1] if fmt in _FORMATS else BLOCK})")
    lib = load()
    if lib is None:
        raise RuntimeError(why_unavailable())
    layout, inputs, nbytes = _FORMATS[fmt]
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.shape != (n, k // inputs * nbytes):
        raise ValueError(f"cannot pack {fmt} rows of shape {raw.shape} as a {n}x{k} weight")
    out = np.empty((n // GROUP, k // BLOCK, LAYOUT_BYTES[layout]), np.uint8)
    if lib.tttr_qpack(FORMATS.index(fmt), raw.ctypes.data, n, k, raw.shape[1], out.ctypes.data):
        raise ValueError(f"pack: the compiled kernel refused a {fmt} weight of shape {n}x{k}")
    return Part(fmt, out)


def pack(fmt: str, raw: np.ndarray, n: int, k: int) -> QuantWeight:
    """One weight's GGUF rows as a QuantWeight of one part (see pack_part)."""
    return QuantWeight((pack_part(fmt, raw, n, k),), (n, k))


def stack(parts: list[Part]) -> QuantWeight:
    """Parts with the same inputs as one weight, their rows one after another."""
    k = parts[0].data.shape[1] * BLOCK
    if any(p.data.shape[1] * BLOCK != k for p in parts) or len(parts) > 8:
        raise ValueError("stack: the parts' inputs differ, or more than 8 parts")
    return QuantWeight(tuple(parts), (sum(p.n for p in parts), k))


def block_weights(parts) -> QuantWeight | None:
    """One weight whose rows are the parts' rows one after another, each part (fmt, raw) a GGUF
    type and its rows (see kernels.ops.block_weights); None when any part does not fit."""
    shapes = [block_shape(fmt, raw) for fmt, raw in parts]
    if not parts or len(parts) > 8 or len({k for _, k in shapes}) != 1 or not available() \
            or not all(supports(fmt, n, k) for (fmt, _), (n, k) in zip(parts, shapes)):
        return None
    return stack([pack_part(fmt, raw, n, k) for (fmt, raw), (n, k) in zip(parts, shapes)])


def linear(x: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    """x [M, K] (any float dtype; made contiguous fp32) -> [M, N] fp32."""
    return apply_torch(_product, x, qw)


def linear_array(x: np.ndarray, qw: QuantWeight, threads: int) -> np.ndarray:
    """`linear` on numpy arrays (the torch-free path): x [M, K] -> [M, N] fp32, the same bits."""
    return apply_array(_product, x, qw, threads)


def apply_torch(product, x: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    """`product(qw, x, m, out, threads)` (this module's, or kernels.cq8's) on torch tensors:
    x [M, K] checked against the weight and made contiguous fp32, out [M, N] fp32 allocated."""
    import torch

    n, k = qw.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"linear: input {tuple(x.shape)} does not match a {n}x{k} weight")
    x = x.to(torch.float32).contiguous()
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    product(qw, x.data_ptr(), x.shape[0], out.data_ptr(), torch.get_num_threads())  # any thread count, same bits
    return out


def apply_array(product, x: np.ndarray, qw: QuantWeight, threads: int) -> np.ndarray:
    """`apply_torch` on numpy arrays (the torch-free path)."""
    n, k = qw.shape
    if x.ndim != 2 or x.shape[1] != k:
        raise ValueError(f"linear: input {tuple(x.shape)} does not match a {n}x{k} weight")
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], n), np.float32)
    product(qw, x.ctypes.data, x.shape[0], out.ctypes.data, threads)
    return out


def _product(qw: QuantWeight, x: int, m: int, out: int, threads: int) -> None:
    lib = load()
    if lib is None:
        raise RuntimeError(why_unavailable())
    nparts, layouts, ptrs, ns = qw._call
    if lib.tttr_qlinear_parts(nparts, layouts, ptrs, ns, qw.shape[1], x, m, out, threads):
        raise ValueError(f"linear: the compiled kernel refused a {qw.fmt} weight of shape {qw.shape[0]}x{qw.shape[1]}")
