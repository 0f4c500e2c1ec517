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
that one order in the plain C body and the AVX2 body (which takes the integer sums with
_mm256_maddubs_epi16 / _mm256_madd_epi16 as llama.cpp does, 16 outputs a step), so the two give
the same bits. A row's result depends on that row's activations and the weight only: not on
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

import numpy as np

from tttr.kernels import cquant
from tttr.kernels.kquants import BLOCK
from tttr.sessions.cache import CLibrary

# the activation quantization llama.cpp pairs with each weight type (ggml's vec_dot_type)
ACTIVATIONS = ("Q8_0", "Q8_1", "Q8_K")
KIND_OF = {"Q4_1": 1, "Q8_0": 0, "Q5_0": 0, "Q4_K": 2, "Q5_K": 2, "Q6_K": 2}

SOURCE = r"""
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define G 16
#define MAXR 4
#define MAXPARTS 8
#define BLOCK_BYTES(L) ((L) == 0 ? 2 * G * 4 + 16 * G : (L) == 1 ? G * 4 + 32 * G : 2 * G * 4 + 32 * G)
#define QOFF(L) ((L) == 1 ? G * 4 : 2 * G * 4)

/* fp32 -> fp16 -> fp32, round to nearest even (ggml's GGML_FP32_TO_FP16 on F16C) */
static inline float round_half(float f) { return (float)(_Float16)f; }

/* ggml-quants.c's nearest_int: round half to even for |v| < 2^22 */
static inline int nearest_int(float v) {
    float t = v + 12582912.f;
    int i;
    memcpy(&i, &t, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

/* One row of K inputs to 8-bit blocks of kind 0 (Q8_0), 1 (Q8_1) or 2 (Q8_K): quants q[K],
   and per 32 inputs the scale d[K/32] and the scaled sum s[K/32] (zero for Q8_0). */
static void quantize_row(int kind, const float *x, int64_t K, int8_t *q, float *d, float *s) {
    if (kind == 2) {
        for (int64_t b0 = 0; b0 < K; b0 += 256) {
            float max = 0.0f, amax = 0.0f;
            for (int j = 0; j < 256; j++) {
                const float ax = fabsf(x[b0 + j]);
                if (ax > amax) { amax = ax; max = x[b0 + j]; }
            }
            float dk = 0.0f;
            if (amax == 0.0f) {
                memset(q + b0, 0, 256);
            } else {
                const float iscale = -127.f / max;
                for (int j = 0; j < 256; j++) {
                    const int v = nearest_int(iscale * x[b0 + j]);
                    q[b0 + j] = (int8_t)(v < 127 ? v : 127);
                }
                dk = 1.0f / iscale;
            }
            for (int c = 0; c < 8; c++) {
                int sum = 0;
                for (int j = 0; j < 32; j++) sum += q[b0 + 32 * c + j];
                d[b0 / 32 + c] = dk;
                s[b0 / 32 + c] = dk * (float)sum;
            }
        }
        return;
    }
    for (int64_t b = 0; b < K / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float db = amax / 127.f, id = amax != 0.0f ? 127.f / amax : 0.0f;
        int sum = 0;
        for (int j = 0; j < 32; j++) {
            const int v = (int)nearbyintf(xb[j] * id);
            q[32 * b + j] = (int8_t)v;
            sum += v;
        }
        d[b] = round_half(db);
        s[b] = kind == 1 ? round_half(db * (float)sum) : 0.0f;
    }
}

/* One group (16 outputs) of a layout-L weight (kquants.py) for R <= MAXR quantized rows:
   quants xq (row stride ldq), scales xd and sums xs (row stride ldb); out row stride ldo. */
#if defined(__AVX2__)
#define KERNEL_NAME "avx2"
/* inputs 4c .. 4c + 3 of the block's 16 outputs as two vectors (outputs 0-7, 8-15), each
   output's four bytes in input order: the layout holds them input by input */
static inline __attribute__((always_inline)) void gather4(const int L, const uint8_t *qs, int c, __m256i *lo,
                                                          __m256i *hi) {
    __m256i a, b;
    if (L == 0) { /* byte p*16 + n: input 2p (low nibble), 2p + 1 (high); pairs 2c, 2c + 1 */
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 2 * c * G)), m = _mm256_set1_epi8(15);
        a = _mm256_and_si256(v, m);                         /* [input 4c | 4c + 2] */
        b = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);   /* [4c + 1 | 4c + 3] */
    } else { /* byte j*16 + n: input j */
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(qs + 4 * c * G));        /* [4c | 4c + 1] */
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(qs + (4 * c + 2) * G));  /* [4c + 2 | 4c + 3] */
        a = _mm256_permute2x128_si256(v0, v1, 0x20);  /* [4c | 4c + 2] */
        b = _mm256_permute2x128_si256(v0, v1, 0x31);  /* [4c + 1 | 4c + 3] */
    }
    /* words (4c, 4c+1) of outputs 0-7 | (4c+2, 4c+3) of outputs 0-7, and the same for 8-15 */
    const __m256i pat = _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                         0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15);
    *lo = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(_mm256_unpacklo_epi8(a, b), 0xD8), pat);
    *hi = _mm256_shuffle_epi8(_mm256_permute4x64_epi64(_mm256_unpackhi_epi8(a, b), 0xD8), pat);
}

static inline __attribute__((always_inline)) void group(const int L, const uint8_t *gw, int64_t nb, const int8_t *xq,
                                                        const float *xd, const float *xs, int64_t ldq, int64_t ldb,
                                                        const int R, float *out, int64_t ldo) {
    __m256 acc[MAXR][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = gw + b * BLOCK_BYTES(L);
        const uint8_t *qs = blk + QOFF(L);
        __m256i s0[MAXR][2], s1[MAXR][2];
        for (int r = 0; r < R; r++) s0[r][0] = s0[r][1] = s1[r][0] = s1[r][1] = _mm256_setzero_si256();
        for (int c = 0; c < 8; c++) {
            __m256i w[2];
            gather4(L, qs, c, &w[0], &w[1]);
            const int sgn = L == 1 || L == 3;  /* signed quants: |w| times x with w's sign */
            __m256i wa[2];
            if (sgn) { wa[0] = _mm256_abs_epi8(w[0]); wa[1] = _mm256_abs_epi8(w[1]); }
            for (int r = 0; r < R; r++) {
                int32_t x4;
                memcpy(&x4, xq + r * ldq + b * 32 + 4 * c, 4);
                const __m256i xv = _mm256_set1_epi32(x4);
                for (int h = 0; h < 2; h++) {
                    const __m256i p = sgn ? _mm256_maddubs_epi16(wa[h], _mm256_sign_epi8(xv, w[h]))
                                          : _mm256_maddubs_epi16(w[h], xv);
                    const __m256i p32 = _mm256_madd_epi16(p, ones);
                    if (L == 3 && c >= 4) s1[r][h] = _mm256_add_epi32(s1[r][h], p32);
                    else s0[r][h] = _mm256_add_epi32(s0[r][h], p32);
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 A = _mm256_loadu_ps((const float *)blk + 8 * h);
            const __m256 B = L == 1 ? A : _mm256_loadu_ps((const float *)blk + G + 8 * h);
            for (int r = 0; r < R; r++) {
                const __m256 dx = _mm256_set1_ps(xd[r * ldb + b]);
                acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(A, dx), _mm256_cvtepi32_ps(s0[r][h]), acc[r][h]);
                if (L == 0 || L == 2)
                    acc[r][h] = _mm256_fmadd_ps(B, _mm256_set1_ps(xs[r * ldb + b]), acc[r][h]);
                else if (L == 3)
                    acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(B, dx), _mm256_cvtepi32_ps(s1[r][h]), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + r * ldo + 8 * h, acc[r][h]);
}
#else
#define KERNEL_NAME "c"
static inline void group(const int L, const uint8_t *gw, int64_t nb, const int8_t *xq, const float *xd,
                         const float *xs, int64_t ldq, int64_t ldb, const int R, float *out, int64_t ldo) {
    float acc[MAXR][G];
    for (int r = 0; r < R; r++) for (int n = 0; n < G; n++) acc[r][n] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = gw + b * BLOCK_BYTES(L);
        const float *A = (const float *)blk, *B = A + G;
        const uint8_t *qs = blk + QOFF(L);
        for (int n = 0; n < G; n++) {
            int w[32];
            for (int j = 0; j < 32; j++)
                w[j] = L == 0 ? (j & 1 ? qs[(j / 2) * G + n] >> 4 : qs[(j / 2) * G + n] & 15) : (int8_t)qs[j * G + n];
            for (int r = 0; r < R; r++) {
                const int8_t *x = xq + r * ldq + b * 32;
                int S0 = 0, S1 = 0;
                for (int j = 0; j < 16; j++) S0 += w[j] * x[j];
                for (int j = 16; j < 32; j++) S1 += w[j] * x[j];
                const float dx = xd[r * ldb + b];
                if (L == 3) {
                    acc[r][n] = fmaf(A[n] * dx, (float)S0, acc[r][n]);
                    acc[r][n] = fmaf(B[n] * dx, (float)S1, acc[r][n]);
                } else {
                    acc[r][n] = fmaf(A[n] * dx, (float)(S0 + S1), acc[r][n]);
                    if (L != 1) acc[r][n] = fmaf(B[n], xs[r * ldb + b], acc[r][n]);
                }
            }
        }
    }
    for (int r = 0; r < R; r++) for (int n = 0; n < G; n++) out[r * ldo + n] = acc[r][n];
}
#endif

typedef void (*group_fn)(const uint8_t *, int64_t, const int8_t *, const float *, const float *, int64_t, int64_t,
                         float *, int64_t);
#define SPECIALISE(L, R) static void group_##L##_##R(const uint8_t *g, int64_t nb, const int8_t *q, const float *d, \
        const float *s, int64_t ldq, int64_t ldb, float *o, int64_t ldo) { group(L, g, nb, q, d, s, ldq, ldb, R, o, ldo); }
#define ALL(L) SPECIALISE(L, 1) SPECIALISE(L, 2) SPECIALISE(L, 3) SPECIALISE(L, 4)
#define ROW(L) {0, group_##L##_1, group_##L##_2, group_##L##_3, group_##L##_4}
ALL(0)
ALL(1)
ALL(2)
ALL(3)
static const group_fn group_fns[4][MAXR + 1] = {ROW(0), ROW(1), ROW(2), ROW(3)};

const char *tttr_q8_kernel(void) { return KERNEL_NAME; }

/* The rows x[M, K] quantized as kind (0 Q8_0, 1 Q8_1, 2 Q8_K): q [M, K], d and s [M, K/32]. */
int tttr_q8_quantize(int kind, const float *x, int64_t M, int64_t K, int8_t *q, float *d, float *s) {
    if (kind < 0 || kind > 2 || K % (kind == 2 ? 256 : 32) || M < 0) return 1;
    for (int64_t r = 0; r < M; r++) quantize_row(kind, x + r * K, K, q + r * K, d + r * (K / 32), s + r * (K / 32));
    return 0;
}

/* The activations one call needs: per kind (Q8_0, Q8_1, Q8_K) that a part asks for, all M rows
   quantized (quants [M, K], scales and sums [M, K/32]), in one allocation. */
typedef struct { int8_t *q[3]; float *d[3], *s[3]; void *mem; } acts;

static int acts_alloc(acts *a, const int need[3], int64_t M, int64_t K) {
    const int64_t nb = K / 32;
    size_t bytes = 0;
    for (int k = 0; k < 3; k++) if (need[k]) bytes += (size_t)(M * K) + 2 * sizeof(float) * (size_t)(M * nb);
    a->mem = malloc(bytes ? bytes : 1);
    if (!a->mem) return 1;
    float *f = (float *)a->mem;
    for (int k = 0; k < 3; k++) {
        if (!need[k]) { a->q[k] = 0; a->d[k] = a->s[k] = 0; continue; }
        a->d[k] = f; a->s[k] = f + M * nb; f += 2 * M * nb;
    }
    int8_t *q = (int8_t *)f;
    for (int k = 0; k < 3; k++) if (need[k]) { a->q[k] = q; q += M * K; }
    return 0;
}

static inline void one_group(int64_t g, int nparts, const int64_t *first, const int *formats, const uint8_t *const *ws,
                             int64_t nb, int64_t K, const acts *a, int64_t M, float *out, int64_t N) {
    int i = 0;
    while (i + 1 < nparts && g >= first[i + 1]) i++;
    const int L = formats[i] & 15, k = formats[i] >> 4;
    const uint8_t *gw = ws[i] + (g - first[i]) * nb * BLOCK_BYTES(L);
    const group_fn *fns = group_fns[L];
    for (int64_t r0 = 0; r0 < M; r0 += MAXR) {
        const int R = M - r0 < MAXR ? (int)(M - r0) : MAXR;
        fns[R](gw, nb, a->q[k] + r0 * K, a->d[k] + r0 * nb, a->s[k] + r0 * nb, K, nb, out + r0 * N + g * G, N);
    }
}

/* out[M, N] = x[M, K] @ w^T with the rows of x quantized for each part as it asks, for a weight
   stacked from nparts parts: part i of ns[i] rows (a multiple of 16) at ws[i], formats[i] =
   its layout | activation kind << 4 (kinds: 0 Q8_0, 1 Q8_1, 2 Q8_K); K a multiple of 32 (of
   256 for a Q8_K part). The same arguments as kernels.cquant's tttr_qlinear_parts, so the
   compiled decode step can call either through one pointer type: from inside an active OpenMP
   region, called by every thread of the team with the same arguments, each thread quantizes
   the rows for itself (the same bits; M * K is small beside the product), the team shares the
   groups and each thread returns after its share (the caller synchronises before reading out);
   otherwise the call opens a region
   of `threads` threads. Each group of 16 outputs is one thread's. Returns nonzero on bad sizes
   (2: out of memory). */
int tttr_q8_linear_parts(int nparts, const int *formats, const uint8_t *const *ws, const int64_t *ns, int64_t K,
                         const float *x, int64_t M, float *out, int threads) {
    if (K % 32 || M < 0 || nparts < 1 || nparts > MAXPARTS) return 1;
    int64_t first[MAXPARTS + 1];
    int need[3] = {0, 0, 0};
    first[0] = 0;
    for (int i = 0; i < nparts; i++) {
        const int L = formats[i] & 15, k = formats[i] >> 4;
        if (ns[i] % G || L > 3 || k < 0 || k > 2 || (k == 2 && K % 256)) return 1;
        first[i + 1] = first[i] + ns[i] / G;
        need[k] = 1;
    }
    if (M == 0) return 0;
    const int64_t nb = K / 32, groups = first[nparts], N = groups * G;
    acts a;
    if (omp_in_parallel()) {
        const int failed = acts_alloc(&a, need, M, K);
        if (!failed)
            for (int k = 0; k < 3; k++)
                if (need[k])
                    for (int64_t r = 0; r < M; r++)
                        quantize_row(k, x + r * K, K, a.q[k] + r * K, a.d[k] + r * nb, a.s[k] + r * nb);
        /* every thread reaches the loop, a failed one taking no groups; each frees its own
           activations and returns without waiting for the others, as cquant's products do: the
           caller synchronises before reading out (libgomp's barrier would spin ~300,000 pauses
           before it sleeps, on a loaded machine milliseconds, four times a layer) */
        #pragma omp for schedule(static) nowait
        for (int64_t g = 0; g < groups; g++)
            if (!failed) one_group(g, nparts, first, formats, ws, nb, K, &a, M, out, N);
        if (failed) return 2;
        free(a.mem);
        return 0;
    }
    if (acts_alloc(&a, need, M, K)) return 2;
    #pragma omp parallel num_threads(threads)
    {
        for (int k = 0; k < 3; k++) {
            if (!need[k]) continue;
            #pragma omp for schedule(static)
            for (int64_t r = 0; r < M; r++)
                quantize_row(k, x + r * K, K, a.q[k] + r * K, a.d[k] + r * nb, a.s[k] + r * nb);
        }
        #pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) one_group(g, nparts, first, formats, ws, nb, K, &a, M, out, N);
    }
    free(a.mem);
    return 0;
}
"""

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
    """"avx2" or "c" (the same bits from each), None when not built."""
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
