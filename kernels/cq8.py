"""Block products with 8-bit activations, as llama.cpp computes them: the `invariant-q8`
kernel mode's products (compiled C, built on first use, called through ctypes).

kernels.cquant multiplies fp32 activations by weights expanded to fp32. llama.cpp instead
quantizes each activation row to 8 bits, 32 or 256 inputs at a time, and sums products of
integers; only the per-block scales meet in float. This module does the same against the
layouts cquant's weights are held in (kquants.py), following ggml-quants.c's arithmetic so
the logits come close to llama.cpp's:

- activations (per row, `quantize`): the kind llama.cpp pairs with the weight's type:
    Q8_1 for Q4_1 weights      per 32 inputs: d = amax / 127, q = round-half-even(x * 127 / amax)
                               (quantize_row_q8_1's AVX2 body); the scale kept as fp16(d) and
                               the block sum as fp16(d * sum q)
    Q8_0 for Q8_0, Q5_0        the same without the sum
    Q8_K for Q4_K, Q5_K, Q6_K  per 256 inputs: scale = -127 / (the input of largest |x|),
                               q = min(127, nearest_int(scale * x)), d = 1 / scale in fp32
                               (quantize_row_q8_K_ref); the sum kept per 32 inputs as d * sum q
- products (per output n, row r, 32-input block b, in block order, one accumulator):
    S = the integer sum of q_w * q_x over the block (exact; Q6_K: S0, S1 over its two halves)
    layout 0/2 (w = A q + B):  acc = fma(A * d_x, S, acc); acc = fma(B, s_x, acc)
    layout 1   (w = A q):      acc = fma(A * d_x, S, acc)
    layout 3   (two scales):   acc = fma(A * d_x, S0, acc); acc = fma(B * d_x, S1, acc)

The integer sums are exact whatever order they are taken in, and the float steps above run in
that one order in the plain C body, the AVX2 body (which takes the integer sums with
_mm256_maddubs_epi16 / _mm256_madd_epi16 as llama.cpp does, 16 outputs a step) and the AVX-512
body (where the CPU has VNNI and VBMI: one byte permutation lays four inputs of 16 outputs side
by side, and one _mm512_dpbusd_epi32 a row sums their products; quants are taken unsigned, q +
32 for Q6_K and q + 128 for int8, the offset times the row's integer sum of 16 quants taken off
the block's sum, still exact), so all three give the same bits. A row's result depends on that row's activations and the weight only: not on
how many rows share the call, the row's place among them, or the thread count (each group of
16 outputs is one thread's). So the mode is batch-invariant as `invariant` is.

The compiled entry `tttr_q8_linear_parts` takes cquant's `tttr_qlinear_parts` arguments, each
part's layout carrying its activation kind (`formats`: layout | kind << 4), and like it may be
called by every thread of an open OpenMP region: the compiled decode step (kernels.cdecode)
calls either through one function pointer, so `invariant-q8` decodes all layers in one call
as `invariant` does (its `invariant-q8` plan passes `formats` in place of the layouts).

It differs from the fp32 products by the activations' rounding (about 1/254 of each block's
largest input), which is what llama.cpp's logits carry too."""

from __future__ import annotations

import ctypes
import weakref
from pathlib import Path

import numpy as np

from tttr.kernels import cquant
from tttr.kernels.kquants import BLOCK
from tttr.sessions.cache import CLibrary, c_source

# the activation quantization llama.cpp pairs with each weight type (ggml's vec_dot_type)
ACTIVATIONS = ("Q8_0", "Q8_1", "Q8_K")
KIND_OF = {"Q4_1": 1, "Q8_0": 0, "Q5_0": 0, "Q4_K": 2, "Q5_K": 2, "Q6_K": 2}

SOURCE = c_source(Path(__file__).with_name("cq8.c"))

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-fast-math", "-ffp-contract=off", "-shared", "-fPIC"]


def _declare(lib) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int64
    ints = ctypes.POINTER(ctypes.c_int)
    lib.tttr_q8_linear_parts.argtypes = [ctypes.c_int, ints, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_int64), i, p, i, p, ctypes.c_int]
    lib.tttr_q8_linear_parts.restype = ctypes.c_int
    lib.tttr_q8_quantize.argtypes = [ctypes.c_int, p, i, i, p, p, p]
    lib.tttr_q8_quantize.restype = ctypes.c_int
    lib.tttr_q8_kernel.restype = ctypes.c_char_p


_library = CLibrary("q8linear", SOURCE, _FLAGS, "the compiled 8-bit-activation block products", _declare)
load, available, why_unavailable = _library.load, _library.available, _library.why_unavailable


def kernel_name() -> str | None:
    """"avx512", "avx2" or "c" (the same bits from each), None when not built."""
    lib = load()
    return None if lib is None else lib.tttr_q8_kernel().decode()


def quantize(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows x [M, K] (fp32) as `kind` (one of ACTIVATIONS) quantizes them: (quants int8 [M, K],
    scale [M, K/32], scaled sum [M, K/32]; per 32 inputs, repeated over a Q8_K block's 8)."""
    lib = load()
    if lib is None:
        raise RuntimeError(why_unavailable())
    x = np.ascontiguousarray(x, dtype=np.float32)
    m, k = x.shape
    q = np.empty((m, k), np.int8)
    d = np.empty((m, k // BLOCK), np.float32)
    s = np.empty((m, k // BLOCK), np.float32)
    if lib.tttr_q8_quantize(ACTIVATIONS.index(kind), x.ctypes.data, m, k, q.ctypes.data, d.ctypes.data, s.ctypes.data):
        raise ValueError(f"quantize: {kind} rows of {k} inputs do not fit its blocks")
    return q, d, s


# a block weight -> the compiled call's arguments for it (layouts, kinds, blocks, row counts)
_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def formats(qw) -> list[int]:
    """The compiled entry's per-part codes for block weight `qw`: layout | activation kind << 4
    (what the compiled decode step would pass in place of cquant's layouts)."""
    return [p.layout | KIND_OF[p.fmt] << 4 for p in qw.parts]


def _call(qw):
    call = _calls.get(qw)
    if call is None:
        n = len(qw.parts)
        call = (n, (ctypes.c_int * n)(*(formats(qw))),
                (ctypes.c_void_p * n)(*(p.data.ctypes.data for p in qw.parts)),
                (ctypes.c_int64 * n)(*(p.n for p in qw.parts)))
        _calls[qw] = call
    return call


def supports(qw) -> bool:
    """Whether every part of block weight `qw` (kernels.cquant.QuantWeight) is a type this
    module pairs with an activation kind."""
    return all(p.fmt in KIND_OF and (KIND_OF[p.fmt] != 2 or qw.shape[1] % 256 == 0) for p in qw.parts)


def linear(x, qw):
    """x [M, K] (torch, any float dtype; made contiguous fp32) -> [M, N] fp32: each row
    quantized to 8 bits as llama.cpp does for the weight's type, times `qw`'s blocks."""
    return cquant.apply_torch(_product, x, qw)


def linear_array(x: np.ndarray, qw, threads: int) -> np.ndarray:
    """`linear` on numpy arrays (the torch-free path): x [M, K] -> [M, N] fp32, the same bits."""
    return cquant.apply_array(_product, x, qw, threads)


def _product(qw, x: int, m: int, out: int, threads: int) -> None:
    lib = load()
    if lib is None:
        raise RuntimeError(why_unavailable())
    nparts, codes, ptrs, ns = _call(qw)
    if lib.tttr_q8_linear_parts(nparts, codes, ptrs, ns, qw.shape[1], x, m, out, threads):
        raise ValueError(f"linear: the 8-bit-activation kernel refused a {qw.fmt} weight of shape "
                         f"{qw.shape[0]}x{qw.shape[1]}")
