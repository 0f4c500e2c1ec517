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
quants input by input. Output row n, input row r sums its products in one fixed order:

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

import numpy as np

from tttr.kernels.kquants import BLOCK, FORMATS as _FORMATS, GROUP, LAYOUT_BYTES, PACK_SOURCE
from tttr.sessions.cache import CLibrary

if TYPE_CHECKING:  # the wrappers import torch when called: the torch-free path never does
    import torch

FORMATS = tuple(_FORMATS)  # the GGUF types whose blocks the products take (kquants.FORMATS)

SOURCE = r"""
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define G 16
#define MAXR 8
#define MAXPARTS 8

/* One group (16 outputs) of a layout-FMT weight (kquants.py: 0 nibbles, w = fma(A, q, B);
   1 int8, w = A * q; 2 int8, w = fma(A, q, B); 3 int8, w = (k < 16 ? A : B) * q; a constant
   once inlined) for R <= 8 input rows x (row stride ldx); out row stride ldo. Per 32-input
   block and input pair p, the two weight vectors are expanded and every row takes its two
   fused multiply-adds. The three bodies below run the same fused multiply-adds in the same
   order. */
#define BLOCK_BYTES(FMT) ((FMT) == 0 ? 2 * G * 4 + 16 * G : (FMT) == 1 ? G * 4 + 32 * G : 2 * G * 4 + 32 * G)
#define QOFF(FMT) ((FMT) == 1 ? G * 4 : 2 * G * 4)
#if defined(__AVX512F__)
#define KERNEL_NAME "avx512"
static inline __attribute__((always_inline)) void group(const int fmt, const uint8_t *gw, int64_t nb, const float *x,
                                                        int64_t ldx, const int R, float *out, int64_t ldo) {
    __m512 acc0[MAXR], acc1[MAXR];
    for (int r = 0; r < R; r++) { acc0[r] = _mm512_setzero_ps(); acc1[r] = _mm512_setzero_ps(); }
    const __m512i low = _mm512_set1_epi32(15);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = gw + b * BLOCK_BYTES(fmt);
        const __m512 A = _mm512_loadu_ps((const float *)blk);
        const __m512 B = fmt == 1 ? A : _mm512_loadu_ps((const float *)blk + G);
        const uint8_t *qs = blk + QOFF(fmt);
        const float *xb = x + b * 32;
        for (int p = 0; p < 16; p++) {
            __m512 w0, w1;
            if (fmt == 0) {
                const __m512i qv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + p * G)));
                w0 = _mm512_fmadd_ps(A, _mm512_cvtepi32_ps(_mm512_and_si512(qv, low)), B);
                w1 = _mm512_fmadd_ps(A, _mm512_cvtepi32_ps(_mm512_srli_epi32(qv, 4)), B);
            } else {
                const __m512 q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + 2 * p * G))));
                const __m512 q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + (2 * p + 1) * G))));
                if (fmt == 2) {
                    w0 = _mm512_fmadd_ps(A, q0, B);
                    w1 = _mm512_fmadd_ps(A, q1, B);
                } else {
                    const __m512 s = fmt == 3 && p >= 8 ? B : A;
                    w0 = _mm512_mul_ps(s, q0);
                    w1 = _mm512_mul_ps(s, q1);
                }
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
/* a group is two 8-lane halves: lanes 0-7 and 8-15; expand8 expands input pair p of one half */
static inline __attribute__((always_inline)) void expand8(const int fmt, const __m256 A, const __m256 B,
                                                          const uint8_t *qs, const int p, __m256 *w0, __m256 *w1) {
    if (fmt == 0) {
        const __m256i qv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + p * G)));
        *w0 = _mm256_fmadd_ps(A, _mm256_cvtepi32_ps(_mm256_and_si256(qv, _mm256_set1_epi32(15))), B);
        *w1 = _mm256_fmadd_ps(A, _mm256_cvtepi32_ps(_mm256_srli_epi32(qv, 4)), B);
    } else {
        const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 2 * p * G))));
        const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + (2 * p + 1) * G))));
        if (fmt == 2) {
            *w0 = _mm256_fmadd_ps(A, q0, B);
            *w1 = _mm256_fmadd_ps(A, q1, B);
        } else {
            const __m256 s = fmt == 3 && p >= 8 ? B : A;
            *w0 = _mm256_mul_ps(s, q0);
            *w1 = _mm256_mul_ps(s, q1);
        }
    }
}

static inline __attribute__((always_inline)) void group(const int fmt, const uint8_t *gw, int64_t nb, const float *x,
                                                        int64_t ldx, const int R, float *out, int64_t ldo) {
    if (R <= 2) {
        /* Few rows (decode): both halves in one pass, so four or eight accumulator chains are in
           flight instead of two or four (one pass per half waits on the fused multiply-add's
           latency). Each lane's sums are the same, in the same order, as below. */
        __m256 acc0[2][2], acc1[2][2];
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < R; r++) { acc0[h][r] = _mm256_setzero_ps(); acc1[h][r] = _mm256_setzero_ps(); }
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = gw + b * BLOCK_BYTES(fmt);
            const __m256 A0 = _mm256_loadu_ps((const float *)blk), A1 = _mm256_loadu_ps((const float *)blk + 8);
            const __m256 B0 = fmt == 1 ? A0 : _mm256_loadu_ps((const float *)blk + G);
            const __m256 B1 = fmt == 1 ? A1 : _mm256_loadu_ps((const float *)blk + G + 8);
            const uint8_t *qs = blk + QOFF(fmt);
            const float *xb = x + b * 32;
            for (int p = 0; p < 16; p++) {
                __m256 w0[2], w1[2];
                expand8(fmt, A0, B0, qs, p, &w0[0], &w1[0]);
                expand8(fmt, A1, B1, qs + 8, p, &w0[1], &w1[1]);
                for (int r = 0; r < R; r++) {
                    const __m256 x0 = _mm256_set1_ps(xb[r * ldx + 2 * p]), x1 = _mm256_set1_ps(xb[r * ldx + 2 * p + 1]);
                    for (int h = 0; h < 2; h++) {
                        acc0[h][r] = _mm256_fmadd_ps(x0, w0[h], acc0[h][r]);
                        acc1[h][r] = _mm256_fmadd_ps(x1, w1[h], acc1[h][r]);
                    }
                }
            }
        }
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < R; r++) _mm256_storeu_ps(out + r * ldo + 8 * h, _mm256_add_ps(acc0[h][r], acc1[h][r]));
        return;
    }
    for (int h = 0; h < 2; h++) {
        __m256 acc0[MAXR], acc1[MAXR];
        for (int r = 0; r < R; r++) { acc0[r] = _mm256_setzero_ps(); acc1[r] = _mm256_setzero_ps(); }
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = gw + b * BLOCK_BYTES(fmt);
            const __m256 A = _mm256_loadu_ps((const float *)blk + 8 * h);
            const __m256 B = fmt == 1 ? A : _mm256_loadu_ps((const float *)blk + G + 8 * h);
            const uint8_t *qs = blk + QOFF(fmt) + 8 * h;
            const float *xb = x + b * 32;
            for (int p = 0; p < 16; p++) {
                __m256 w0, w1;
                expand8(fmt, A, B, qs, p, &w0, &w1);
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
        const float *A = (const float *)blk, *B = A + G;
        const uint8_t *qs = blk + QOFF(fmt);
        const int8_t *qi = (const int8_t *)qs;
        for (int p = 0; p < 16; p++)
            for (int n = 0; n < G; n++) {
                float w0, w1;
                if (fmt == 0) {
                    w0 = fmaf(A[n], (float)(qs[p * G + n] & 15), B[n]);
                    w1 = fmaf(A[n], (float)(qs[p * G + n] >> 4), B[n]);
                } else if (fmt == 2) {
                    w0 = fmaf(A[n], (float)qi[2 * p * G + n], B[n]);
                    w1 = fmaf(A[n], (float)qi[(2 * p + 1) * G + n], B[n]);
                } else {
                    const float s = fmt == 3 && p >= 8 ? B[n] : A[n];
                    w0 = s * (float)qi[2 * p * G + n];
                    w1 = s * (float)qi[(2 * p + 1) * G + n];
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
#define ROW(FMT) {0, group_##FMT##_1, group_##FMT##_2, group_##FMT##_3, group_##FMT##_4, group_##FMT##_5, \
                  group_##FMT##_6, group_##FMT##_7, group_##FMT##_8}
ALL(0)
ALL(1)
ALL(2)
ALL(3)
static const group_fn group_fns[4][MAXR + 1] = {ROW(0), ROW(1), ROW(2), ROW(3)};

const char *tttr_qlinear_kernel(void) { return KERNEL_NAME; }

/* Outputs g*16 .. g*16+15 of all M rows: the same calls whichever thread runs it. */
static inline void one_group(int64_t g, const int64_t *first, const int *formats, const uint8_t *const *ws,
                             int64_t nb, int64_t K, const float *x, int64_t M, float *out, int64_t N) {
    int i = 0;
    while (g >= first[i + 1]) i++;
    const int fmt = formats[i];
    const uint8_t *gw = ws[i] + (g - first[i]) * nb * BLOCK_BYTES(fmt);
    const group_fn *fns = group_fns[fmt];
    for (int64_t r0 = 0; r0 < M; r0 += MAXR) {
        const int R = M - r0 < MAXR ? (int)(M - r0) : MAXR;
        fns[R](gw, nb, x + r0 * K, K, out + r0 * N + g * G, N);
    }
}

/* out[M, N] = x[M, K] @ w^T for a weight stacked from nparts parts, part i of ns[i] rows (a
   multiple of 16) in layout formats[i] at ws[i]; N the sum; K a multiple of 32. Each group of
   16 outputs is one thread's, whatever part it is in. Returns nonzero on bad sizes.
   Called from inside an active OpenMP parallel region (the compiled decode step's one region
   a pass), by every thread of its team with the same arguments, each thread computes its
   share of the groups and returns without waiting for the others (`threads` is not read):
   the caller synchronises before reading out. Otherwise the call opens a region of `threads`
   threads of its own. */
int tttr_qlinear_parts(int nparts, const int *formats, const uint8_t *const *ws, const int64_t *ns, int64_t K,
                       const float *x, int64_t M, float *out, int threads) {
    if (K % 32 || M < 0 || nparts < 1 || nparts > MAXPARTS) return 1;
    int64_t first[MAXPARTS + 1];
    first[0] = 0;
    for (int i = 0; i < nparts; i++) {
        if (ns[i] % G || formats[i] < 0 || formats[i] > 3) return 1;
        first[i + 1] = first[i] + ns[i] / G;
    }
    const int64_t nb = K / 32, groups = first[nparts], N = groups * G;
    if (omp_in_parallel()) {
        #pragma omp for schedule(static) nowait
        for (int64_t g = 0; g < groups; g++) one_group(g, first, formats, ws, nb, K, x, M, out, N);
        return 0;
    }
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t g = 0; g < groups; g++) one_group(g, first, formats, ws, nb, K, x, M, out, N);
    return 0;
}

/* The same for a weight of one part. */
int tttr_qlinear(int format, const uint8_t *w, int64_t N, int64_t K, const float *x, int64_t M,
                 float *out, int threads) {
    return tttr_qlinear_parts(1, &format, &w, &N, K, x, M, out, threads);
}
""" + PACK_SOURCE

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
