"""Matrix products straight from a GGUF file's quantized blocks, compiled C (built on first use
with the system compiler, cached, called through ctypes), for both kernel modes.

A GGUF weight stored as Q4_1 (w = d*q + m, q in 0..15, d and m fp16 per 32 inputs) or Q8_0
(w = d*q, q in -128..127) holds the same values the fp32 copy holds, in 5 or 8.5 bits a
weight instead of 32: the default model's 538 MB of fp32 products read 110 MB instead, which
stays in the last-level cache from one decode step to the next. Each weight is expanded to
exactly the fp32 value `gguf.quants.dequantize` gives (d*q is exact in fp32, so fma(d, q, m)
rounds once, as d*q + m does) and multiplied in fp32: the same arithmetic on the same values
as a dense fp32 product, in a summation order of its own.

Layout, made once per weight (`pack`): output rows in groups of 16, one vector lane per row;
per group and 32-input block, the 16 rows' scales (and minimums), then the quants input by
input. Output row n, input row r sums its products in one fixed order:

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

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from tttr.sessions.cache import CLibrary

GROUP = 16  # output rows per group (one AVX-512 vector)
BLOCK = 32  # inputs per GGUF block, for both formats
# bytes per (group, block): Q4_1 scales + minimums + 32 x 16 nibbles; Q8_0 scales + 32 x 16 int8
_GROUP_BLOCK_BYTES = {"Q4_1": 2 * GROUP * 4 + 16 * GROUP, "Q8_0": GROUP * 4 + 32 * GROUP}
_GGUF_BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}
FORMATS = tuple(_GROUP_BLOCK_BYTES)

SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define G 16
#define Q4_BYTES (2 * G * 4 + 16 * G)
#define Q8_BYTES (G * 4 + 32 * G)
#define MAXR 8

/* One group (16 outputs) of a format-FMT weight (0: Q4_1, 1: Q8_0; a constant once inlined)
   for R <= 8 input rows x (row stride ldx); out row stride ldo. Per 32-input block and input
   pair p, the two weight vectors are expanded (Q4_1: fma(d, q, m); Q8_0: d * q, exact) and
   every row takes its two fused multiply-adds. The three bodies below run the same fused
   multiply-adds in the same order. */
#define BLOCK_BYTES(FMT) ((FMT) == 0 ? Q4_BYTES : Q8_BYTES)
#if defined(__AVX512F__)
#define KERNEL_NAME "avx512"
static inline __attribute__((always_inline)) void group(const int fmt, const uint8_t *gw, int64_t nb, const float *x,
                                                        int64_t ldx, const int R, float *out, int64_t ldo) {
    __m512 acc0[MAXR], acc1[MAXR];
    for (int r = 0; r < R; r++) { acc0[r] = _mm512_setzero_ps(); acc1[r] = _mm512_setzero_ps(); }
    const __m512i low = _mm512_set1_epi32(15);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = gw + b * BLOCK_BYTES(fmt);
        const __m512 d = _mm512_loadu_ps((const float *)blk);
        const __m512 m = fmt == 0 ? _mm512_loadu_ps((const float *)blk + G) : d;
        const uint8_t *qs = blk + (fmt == 0 ? 2 : 1) * G * 4;
        const float *xb = x + b * 32;
        for (int p = 0; p < 16; p++) {
            __m512 w0, w1;
            if (fmt == 0) {
                const __m512i qv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + p * G)));
                w0 = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(qv, low)), m);
                w1 = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_srli_epi32(qv, 4)), m);
            } else {
                w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + 2 * p * G)))));
                w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + (2 * p + 1) * G)))));
            }
            for (int r = 0; r < R; r++) {
                acc0[r] = _mm512_fmadd_ps(_mm512_set1_ps(xb[r * ldx + 2 * p]), w0, acc0[r]);
                acc1[r] = _mm512_fmadd_ps(_mm512_set1_ps(xb[r * ldx + 2 * p + 1]), w1, acc1[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * ldo, _mm512_add_ps(acc0[r], acc1[r]));
}
#elif defined(__AVX2__) && defined(__FMA__)
#define KERNEL_NAME "avx2"
/* a group is two 8-lane halves: lanes 0-7 and 8-15 */
static inline __attribute__((always_inline)) void group(const int fmt, const uint8_t *gw, int64_t nb, const float *x,
                                                        int64_t ldx, const int R, float *out, int64_t ldo) {
    for (int h = 0; h < 2; h++) {
        __m256 acc0[MAXR], acc1[MAXR];
        for (int r = 0; r < R; r++) { acc0[r] = _mm256_setzero_ps(); acc1[r] = _mm256_setzero_ps(); }
        const __m256i low = _mm256_set1_epi32(15);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = gw + b * BLOCK_BYTES(fmt);
            const __m256 d = _mm256_loadu_ps((const float *)blk + 8 * h);
            const __m256 m = fmt == 0 ? _mm256_loadu_ps((const float *)blk + G + 8 * h) : d;
            const uint8_t *qs = blk + (fmt == 0 ? 2 : 1) * G * 4 + 8 * h;
            const float *xb = x + b * 32;
            for (int p = 0; p < 16; p++) {
                __m256 w0, w1;
                if (fmt == 0) {
                    const __m256i qv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + p * G)));
                    w0 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(qv, low)), m);
                    w1 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(qv, 4)), m);
                } else {
                    w0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 2 * p * G)))));
                    w1 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + (2 * p + 1) * G)))));
                }
                for (int r = 0; r < R; r++) {
                    acc0[r] = _mm256_fmadd_ps(_mm256_set1_ps(xb[r * ldx + 2 * p]), w0, acc0[r]);
                    acc1[r] = _mm256_fmadd_ps(_mm256_set1_ps(xb[r * ldx + 2 * p + 1]), w1, acc1[r]);
                }
            }
        }
        for (int r = 0; r < R; r++) _mm256_storeu_ps(out + r * ldo + 8 * h, _mm256_add_ps(acc0[r], acc1[r]));
    }
}
#else
#define KERNEL_NAME "c"
static inline void group(const int fmt, const uint8_t *gw, int64_t nb, const float *x, int64_t ldx, const int R,
                         float *out, int64_t ldo) {
    float acc0[MAXR][G], acc1[MAXR][G];
    for (int r = 0; r < R; r++) for (int n = 0; n < G; n++) acc0[r][n] = acc1[r][n] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = gw + b * BLOCK_BYTES(fmt);
        const float *d = (const float *)blk, *m = d + G;
        const uint8_t *qs = blk + (fmt == 0 ? 2 : 1) * G * 4;
        for (int p = 0; p < 16; p++)
            for (int n = 0; n < G; n++) {
                float w0, w1;
                if (fmt == 0) {
                    w0 = fmaf(d[n], (float)(qs[p * G + n] & 15), m[n]);
                    w1 = fmaf(d[n], (float)(qs[p * G + n] >> 4), m[n]);
                } else {
                    w0 = d[n] * (float)((const int8_t *)qs)[2 * p * G + n];
                    w1 = d[n] * (float)((const int8_t *)qs)[(2 * p + 1) * G + n];
                }
                for (int r = 0; r < R; r++) {
                    acc0[r][n] = fmaf(x[r * ldx + b * 32 + 2 * p], w0, acc0[r][n]);
                    acc1[r][n] = fmaf(x[r * ldx + b * 32 + 2 * p + 1], w1, acc1[r][n]);
                }
            }
    }
    for (int r = 0; r < R; r++) for (int n = 0; n < G; n++) out[r * ldo + n] = acc0[r][n] + acc1[r][n];
}
#endif

typedef void (*group_fn)(const uint8_t *, int64_t, const float *, int64_t, float *, int64_t);
#define SPECIALISE(FMT, R) static void group_##FMT##_##R(const uint8_t *g, int64_t nb, const float *x, int64_t ldx, \
                                                          float *o, int64_t ldo) { group(FMT, g, nb, x, ldx, R, o, ldo); }
#define ALL(FMT) SPECIALISE(FMT, 1) SPECIALISE(FMT, 2) SPECIALISE(FMT, 3) SPECIALISE(FMT, 4) \
                 SPECIALISE(FMT, 5) SPECIALISE(FMT, 6) SPECIALISE(FMT, 7) SPECIALISE(FMT, 8)
ALL(0)
ALL(1)
static const group_fn group_fns[2][MAXR + 1] = {
    {0, group_0_1, group_0_2, group_0_3, group_0_4, group_0_5, group_0_6, group_0_7, group_0_8},
    {0, group_1_1, group_1_2, group_1_3, group_1_4, group_1_5, group_1_6, group_1_7, group_1_8},
};

const char *tttr_qlinear_kernel(void) { return KERNEL_NAME; }

/* out[M, N] = x[M, K] @ w^T for a packed weight w (format 0: Q4_1, 1: Q8_0) of N rows
   (a multiple of 16) and K inputs (a multiple of 32). Returns nonzero on bad sizes. */
int tttr_qlinear(int format, const uint8_t *w, int64_t N, int64_t K, const float *x, int64_t M,
                 float *out, int threads) {
    if (N % G || K % 32 || M < 0 || (format != 0 && format != 1)) return 1;
    const int64_t nb = K / 32, groups = N / G, gbytes = nb * BLOCK_BYTES(format);
    const group_fn *fns = group_fns[format];
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t g = 0; g < groups; g++)
        for (int64_t r0 = 0; r0 < M; r0 += MAXR) {
            const int R = M - r0 < MAXR ? (int)(M - r0) : MAXR;
            fns[R](w + g * gbytes, nb, x + r0 * K, K, out + r0 * N + g * G, N);
        }
    return 0;
}

/* fp16 -> fp32, exact (every half is a float) */
static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        float f = (float)m * 0x1p-24f; /* zero or subnormal: m * 2^-24, exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (e == 31) {
        bits = sign | 0x7f800000u | (m << 13);
    } else {
        bits = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* The kernel's layout (see `pack` in cquant.py) from N GGUF rows of K inputs, row r at
   raw + r * row_bytes: per group of 16 rows and 32-input block, the 16 scales as fp32 (Q4_1:
   then the 16 minimums), then the quants input by input, one byte per row (Q4_1: inputs 2p and
   2p + 1 in one byte, low nibble first). Returns nonzero on bad sizes. */
int tttr_qpack(int format, const uint8_t *raw, int64_t N, int64_t K, int64_t row_bytes, uint8_t *out) {
    if (N % G || K % 32 || (format != 0 && format != 1)) return 1;
    const int64_t nb = K / 32, groups = N / G, bb = format == 0 ? 20 : 34, gb = BLOCK_BYTES(format);
    if (row_bytes < nb * bb) return 1;
    /* one thread: bound by memory, and a parallel region per weight at load cost more than it
       gained (measured 0.46 vs 0.17 s for the default model on 2 busy cores) */
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + (g * nb + b) * gb;
            for (int lane = 0; lane < G; lane++) {
                const uint8_t *blk = raw + (g * G + lane) * row_bytes + b * bb;
                uint16_t h;
                memcpy(&h, blk, 2);
                const float d = half_to_float(h);
                memcpy(o + 4 * lane, &d, 4);
                if (format == 0) {
                    memcpy(&h, blk + 2, 2);
                    const float m = half_to_float(h);
                    memcpy(o + 4 * G + 4 * lane, &m, 4);
                    const uint8_t *qs = blk + 4; /* byte j: input j (low nibble), input j + 16 (high) */
                    for (int p = 0; p < 16; p++) {
                        const int i0 = 2 * p, i1 = 2 * p + 1;
                        const uint8_t q0 = i0 < 16 ? qs[i0] & 15 : qs[i0 - 16] >> 4;
                        const uint8_t q1 = i1 < 16 ? qs[i1] & 15 : qs[i1 - 16] >> 4;
                        o[2 * G * 4 + p * G + lane] = (uint8_t)(q0 | (q1 << 4));
                    }
                } else {
                    for (int j = 0; j < 32; j++) o[G * 4 + j * G + lane] = blk[2 + j];
                }
            }
        }
    return 0;
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-fast-math", "-ffp-contract=off", "-shared", "-fPIC"]


def _declare(lib) -> None:
    p, i = ctypes.c_void_p, ctypes.c_int64
    lib.tttr_qlinear.argtypes = [ctypes.c_int, p, i, i, p, i, p, ctypes.c_int]
    lib.tttr_qlinear.restype = ctypes.c_int
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
    per_block = _GGUF_BLOCK_BYTES.get(fmt)
    return (0, 0) if per_block is None else (raw.shape[0], raw.shape[1] // per_block * BLOCK)


def supports(fmt: str, n: int, k: int) -> bool:
    return fmt in FORMATS and n % GROUP == 0 and k % BLOCK == 0


@dataclass(frozen=True, eq=False)
class QuantWeight:
    """A weight held only as its blocks, in the kernel's layout: what the model keeps in place
    of an fp32 [N, K] tensor (`shape`). Products run from it (`linear`); `rows` and `dense`
    expand rows to the exact fp32 values `gguf.quants.dequantize` gives, for the embedding
    lookup and for any dense product asked of it."""

    fmt: str
    shape: tuple[int, int]
    data: np.ndarray  # uint8, [N / 16, K / 32, group-block bytes]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` (int64 [R]) as fp32 [R, K]: d * q (+ m), d * q exact in fp32 and one
        rounding for + m, as gguf computes them."""
        ids = ids.numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids, dtype=np.int64)
        ng, nb, _ = self.data.shape
        g, lane = ids // GROUP, ids % GROUP
        d = self.data[:, :, :GROUP * 4].view(np.float32)[g, :, lane][:, :, None]  # [R, nb, 1]
        if self.fmt == "Q4_1":
            m = self.data[:, :, GROUP * 4:2 * GROUP * 4].view(np.float32)[g, :, lane][:, :, None]
            pairs = self.data[:, :, 2 * GROUP * 4:].reshape(ng, nb, 16, GROUP)[g, :, :, lane]  # [R, nb, 16]
            q = np.stack([pairs & 15, pairs >> 4], axis=-1).reshape(len(ids), nb, BLOCK).astype(np.float32)
            w = d * q + m
        else:
            q = self.data[:, :, GROUP * 4:].reshape(ng, nb, BLOCK, GROUP).view(np.int8)[g, :, :, lane]
            w = d * q.astype(np.float32)
        return torch.from_numpy(w.reshape(len(ids), self.shape[1]))

    def dense(self) -> torch.Tensor:
        """The whole weight as fp32 [N, K] (a new tensor each call: the caller keeps it or not)."""
        return self.rows(np.arange(self.shape[0], dtype=np.int64))


def pack(fmt: str, raw: np.ndarray, n: int, k: int) -> QuantWeight:
    """`raw`: the GGUF tensor's bytes as rows, [n, k / 32 * block bytes] uint8 (what
    `GGUFReader` gives, rows permuted or concatenated as the fp32 weight's were), rearranged
    by the compiled `tttr_qpack` (one pass over the bytes, no fp32 anywhere)."""
    if not supports(fmt, n, k):
        raise ValueError(f"cannot pack a {fmt} weight of shape {n}x{k} (needs rows % {GROUP} and inputs % {BLOCK})")
    lib = load()
    if lib is None:
        raise RuntimeError(why_unavailable())
    nb = k // BLOCK
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.shape != (n, nb * _GGUF_BLOCK_BYTES[fmt]):
        raise ValueError(f"cannot pack {fmt} rows of shape {raw.shape} as a {n}x{k} weight")
    out = np.empty((n // GROUP, nb, _GROUP_BLOCK_BYTES[fmt]), np.uint8)
    if lib.tttr_qpack(FORMATS.index(fmt), raw.ctypes.data, n, k, raw.shape[1], out.ctypes.data):
        raise ValueError(f"pack: the compiled kernel refused a {fmt} weight of shape {n}x{k}")
    return QuantWeight(fmt, (n, k), out)


def linear(x: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    """x [M, K] (any float dtype; made contiguous fp32) -> [M, N] fp32."""
    lib = load()
    if lib is None:
        raise RuntimeError(why_unavailable())
    n, k = qw.shape
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"linear: input {tuple(x.shape)} does not match a {n}x{k} weight")
    x = x.to(torch.float32).contiguous()
    out = torch.empty(x.shape[0], n, dtype=torch.float32)
    status = lib.tttr_qlinear(FORMATS.index(qw.fmt), qw.data.ctypes.data, n, k, x.data_ptr(), x.shape[0],
                              out.data_ptr(), torch.get_num_threads())  # any thread count, same bits
    if status:
        raise ValueError(f"linear: the compiled kernel refused a {qw.fmt} weight of shape {n}x{k}")
    return out
