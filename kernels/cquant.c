
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
   1 int8, w = A * q; 2 int8, w = fma(A, q, B); 3 int8, w = (k < 16 ? A : B) * q; 4 nibbles as
   0 and 5 6-bit quants as 3, A and B made from the super-block's scales (kquants.h); a constant
   once inlined) for R <= 8 input rows x (row stride ldx); out row stride ldo. Per 32-input
   block and input pair p, the two weight vectors are expanded and every row takes its two
   fused multiply-adds. The three bodies below run the same fused multiply-adds in the same
   order. */
#include "klayout.h"
#if defined(__AVX512F__)
#define KERNEL_NAME "avx512"
static inline __attribute__((always_inline)) void group(const int fmt, const uint8_t *gw, int64_t nb, const float *x,
                                                        int64_t ldx, const int R, float *out, int64_t ldo) {
    __m512 acc0[MAXR], acc1[MAXR];
    for (int r = 0; r < R; r++) { acc0[r] = _mm512_setzero_ps(); acc1[r] = _mm512_setzero_ps(); }
    const __m512i low = _mm512_set1_epi32(15);
    for (int64_t b = 0; b < nb; b++) {
        const Block k = block_at(fmt, gw, b);
        PREFETCH(fmt, gw, b);
        __m512 A, B;
        if (fmt < 4) {
            A = _mm512_loadu_ps((const float *)k.blk);
            B = fmt == 1 ? A : _mm512_loadu_ps((const float *)k.blk + G);
        } else if (fmt == 4) {
            A = _mm512_mul_ps(_mm512_loadu_ps(k.d), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)k.sa))));
            B = _mm512_mul_ps(_mm512_loadu_ps(k.dm), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)k.sb_))));
        } else {
            const __m512 d = _mm512_loadu_ps(k.d);
            A = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)k.sa))));
            B = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)k.sb_))));
        }
        const uint8_t *qs = k.qs;
        const float *xb = x + b * 32;
        for (int p = 0; p < 16; p++) {
            __m512 w0, w1;
            if (fmt == 5) {
                const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + p * G)));
                const __m512i hv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(k.qh + (p >> 1) * G)));
                const __m512i hs = (p & 1) ? hv : _mm512_slli_epi32(hv, 4), m30 = _mm512_set1_epi32(0x30);
                const __m512i q0 = _mm512_or_si512(_mm512_and_si512(lo, low), _mm512_and_si512(hs, m30));
                const __m512i q1 = _mm512_or_si512(_mm512_srli_epi32(lo, 4), _mm512_and_si512(_mm512_srli_epi32(hs, 2), m30));
                const __m512i c32 = _mm512_set1_epi32(32);
                const __m512 s = p >= 8 ? B : A;
                w0 = _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_sub_epi32(q0, c32)));
                w1 = _mm512_mul_ps(s, _mm512_cvtepi32_ps(_mm512_sub_epi32(q1, c32)));
            } else if (fmt == 0 || fmt == 4) {
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
/* a group is two 8-lane halves: lanes 0-7 and 8-15; half h of block k's A and B */
static inline __attribute__((always_inline)) void scales8(const int fmt, const Block k, const int h, __m256 *A,
                                                          __m256 *B) {
    if (fmt < 4) {
        *A = _mm256_loadu_ps((const float *)k.blk + 8 * h);
        *B = fmt == 1 ? *A : _mm256_loadu_ps((const float *)k.blk + G + 8 * h);
    } else if (fmt == 4) {
        *A = _mm256_mul_ps(_mm256_loadu_ps(k.d + 8 * h),
                           _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(k.sa + 8 * h)))));
        *B = _mm256_mul_ps(_mm256_loadu_ps(k.dm + 8 * h),
                           _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(k.sb_ + 8 * h)))));
    } else {
        const __m256 d = _mm256_loadu_ps(k.d + 8 * h);
        *A = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(k.sa + 8 * h)))));
        *B = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(k.sb_ + 8 * h)))));
    }
}

/* input pair p of one half (qs, qh: the half's quants) */
static inline __attribute__((always_inline)) void expand8(const int fmt, const __m256 A, const __m256 B,
                                                          const uint8_t *qs, const uint8_t *qh, const int p,
                                                          __m256 *w0, __m256 *w1) {
    if (fmt == 5) {
        const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + p * G)));
        const __m256i hv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qh + (p >> 1) * G)));
        const __m256i hs = (p & 1) ? hv : _mm256_slli_epi32(hv, 4), m30 = _mm256_set1_epi32(0x30);
        const __m256i q0 = _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(15)), _mm256_and_si256(hs, m30));
        const __m256i q1 = _mm256_or_si256(_mm256_srli_epi32(lo, 4), _mm256_and_si256(_mm256_srli_epi32(hs, 2), m30));
        const __m256i c32 = _mm256_set1_epi32(32);
        const __m256 s = p >= 8 ? B : A;
        *w0 = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_sub_epi32(q0, c32)));
        *w1 = _mm256_mul_ps(s, _mm256_cvtepi32_ps(_mm256_sub_epi32(q1, c32)));
    } else if (fmt == 0 || fmt == 4) {
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
            const Block k = block_at(fmt, gw, b);
        PREFETCH(fmt, gw, b);
            __m256 A0, A1, B0, B1;
            scales8(fmt, k, 0, &A0, &B0);
            scales8(fmt, k, 1, &A1, &B1);
            const uint8_t *qs = k.qs, *qh = k.qh;
            const float *xb = x + b * 32;
            for (int p = 0; p < 16; p++) {
                __m256 w0[2], w1[2];
                expand8(fmt, A0, B0, qs, qh, p, &w0[0], &w1[0]);
                expand8(fmt, A1, B1, qs + 8, qh ? qh + 8 : qh, p, &w0[1], &w1[1]);
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
            const Block k = block_at(fmt, gw, b);
        PREFETCH(fmt, gw, b);
            __m256 A, B;
            scales8(fmt, k, h, &A, &B);
            const uint8_t *qs = k.qs + 8 * h, *qh = k.qh ? k.qh + 8 * h : k.qh;
            const float *xb = x + b * 32;
            for (int p = 0; p < 16; p++) {
                __m256 w0, w1;
                expand8(fmt, A, B, qs, qh, p, &w0, &w1);
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
        const Block k = block_at(fmt, gw, b);
        PREFETCH(fmt, gw, b);
        float A[G], B[G];
        for (int n = 0; n < G; n++) {
            if (fmt < 4) {
                A[n] = ((const float *)k.blk)[n];
                B[n] = ((const float *)k.blk)[G + n];
            } else if (fmt == 4) {
                A[n] = k.d[n] * (float)k.sa[n];
                B[n] = k.dm[n] * (float)k.sb_[n];
            } else {
                A[n] = k.d[n] * (float)(int8_t)k.sa[n];
                B[n] = k.d[n] * (float)(int8_t)k.sb_[n];
            }
        }
        const uint8_t *qs = k.qs;
        const int8_t *qi = (const int8_t *)qs;
        for (int p = 0; p < 16; p++)
            for (int n = 0; n < G; n++) {
                float w0, w1;
                if (fmt == 5) {
                    const int h = k.qh[(p >> 1) * G + n] >> (4 * (p & 1));
                    const float s = p >= 8 ? B[n] : A[n];
                    w0 = s * (float)(((qs[p * G + n] & 15) | ((h & 3) << 4)) - 32);
                    w1 = s * (float)(((qs[p * G + n] >> 4) | (((h >> 2) & 3) << 4)) - 32);
                } else if (fmt == 0 || fmt == 4) {
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
ALL(4)
ALL(5)
static const group_fn group_fns[NLAYOUTS][MAXR + 1] = {ROW(0), ROW(1), ROW(2), ROW(3), ROW(4), ROW(5)};

const char *tttr_qlinear_kernel(void) { return KERNEL_NAME; }

/* Rows are taken ROW_TILE at a time, every group of outputs for one tile before the next, so a
   tile of x (ROW_TILE x K floats, 2 MiB at K = 8192) stays in cache while the weight streams past
   it; over all M rows at once, a long prompt's x (64 MiB for a 1B model's down projection at
   2,048 rows) came from memory again for every group of 16 outputs. Each row's outputs are the
   same calls on the same values whatever the tiling (rows MAXR at a time, each with its own
   accumulators): the same bits. An x that fits in cache (up to TILE_MIN_BYTES: the default
   model's prompts) is taken whole, as before: there tiles only re-read the weight. */
#define ROW_TILE 64
#ifndef TILE_MIN_BYTES
#define TILE_MIN_BYTES (8 << 20)
#endif

/* Outputs g*16 .. g*16+15 of rows r0..r1-1: the same calls whichever thread runs it. */
static inline void one_group(int64_t g, const int64_t *first, const int *formats, const uint8_t *const *ws,
                             int64_t nb, int64_t K, const float *x, int64_t r0, int64_t r1, float *out, int64_t N) {
    int i = 0;
    while (g >= first[i + 1]) i++;
    const int fmt = formats[i];
    const uint8_t *gw = ws[i] + (g - first[i]) * nb * BLOCK_BYTES(fmt);
    const group_fn *fns = group_fns[fmt];
    for (int64_t r = r0; r < r1; r += MAXR) {
        const int R = r1 - r < MAXR ? (int)(r1 - r) : MAXR;
        fns[R](gw, nb, x + r * K, K, out + r * N + g * G, N);
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
        if (ns[i] % G || formats[i] < 0 || formats[i] >= NLAYOUTS || (formats[i] >= 4 && K % 256)) return 1;
        first[i + 1] = first[i] + ns[i] / G;
    }
    const int64_t nb = K / 32, groups = first[nparts], N = groups * G;
    const int64_t tile = M * K * (int64_t)sizeof(float) > TILE_MIN_BYTES ? ROW_TILE : (M > 0 ? M : 1);
    if (omp_in_parallel()) {
        for (int64_t t0 = 0; t0 < M; t0 += tile) {
            const int64_t t1 = M - t0 < tile ? M : t0 + tile;
            #pragma omp for schedule(static) nowait
            for (int64_t g = 0; g < groups; g++) one_group(g, first, formats, ws, nb, K, x, t0, t1, out, N);
        }
        return 0;
    }
    #pragma omp parallel num_threads(threads)
    for (int64_t t0 = 0; t0 < M; t0 += tile) {
        const int64_t t1 = M - t0 < tile ? M : t0 + tile;
        #pragma omp for schedule(static) nowait
        for (int64_t g = 0; g < groups; g++) one_group(g, first, formats, ws, nb, K, x, t0, t1, out, N);
    }
    return 0;
}

/* The same for a weight of one part. */
int tttr_qlinear(int format, const uint8_t *w, int64_t N, int64_t K, const float *x, int64_t M,
                 float *out, int threads) {
    return tttr_qlinear_parts(1, &format, &w, &N, K, x, M, out, threads);
}
#include "kquants.h"
