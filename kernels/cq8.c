
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define G 16
#define MAXPARTS 8
#include "klayout.h"

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

/* The integer sums of each 16 quants of a quantized row of K inputs: t[K/16] (the AVX-512 body's
   offsets, below) */
static void sums16(const int8_t *q, int64_t K, int32_t *t) {
    for (int64_t u = 0; u < K / 16; u++) {
        int32_t sum = 0;
        for (int j = 0; j < 16; j++) sum += q[16 * u + j];
        t[u] = sum;
    }
}

/* One group (16 outputs) of a layout-L weight (kquants.py) for R <= MAXR quantized rows:
   quants xq (row stride ldq), scales xd and sums xs (row stride ldb), integer sums of 16
   quants xt (row stride ldt); out row stride ldo. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define KERNEL_NAME "avx512"
#define MAXR 8
/* Inputs 4c .. 4c + 3 of the block's 16 outputs as one vector, output n's four bytes at 4n in input
   order, each quant as an unsigned byte u = q + off (off: 0 for the unsigned nibbles and layout 2,
   32 for layout 5's 6 bits, 128 for layouts 1 and 3's int8) so that one _mm512_dpbusd_epi32 (u8 x
   s8, four products summed into int32, exact) takes a row's four products for all 16 outputs;
   the block's sum then takes off off * (the sum of the row's quants), exact too. The nibble
   layouts' 64 bytes of four input pairs give two quads (c even, c + 1). */
static inline __attribute__((always_inline)) void quads2(const int L, const Block *k, int cc, __m512i *w0, __m512i *w1) {
    if (L == 0 || L == 4 || L == 5) {  /* byte p*16 + n: input 2p (low nibble), 2p + 1 (high) */
        const __m512i v = _mm512_loadu_si512((const void *)(k->qs + 64 * cc)), m = _mm512_set1_epi8(15);
        const __m512i lo = _mm512_and_si512(v, m), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m);
        /* byte 4n + i of quad 2cc + e: input 8cc + 4e + i of output n: pair 4cc + 2e + i / 2, nibble i % 2 */
        const __m512i i0 = _mm512_set_epi32(
            0x5f1f4f0f, 0x5e1e4e0e, 0x5d1d4d0d, 0x5c1c4c0c, 0x5b1b4b0b, 0x5a1a4a0a, 0x59194909, 0x58184808,
            0x57174707, 0x56164606, 0x55154505, 0x54144404, 0x53134303, 0x52124202, 0x51114101, 0x50104000);
        const __m512i i1 = _mm512_add_epi8(i0, _mm512_set1_epi8(32));
        *w0 = _mm512_permutex2var_epi8(lo, i0, hi);
        *w1 = _mm512_permutex2var_epi8(lo, i1, hi);
        if (L == 5) { /* byte c*16 + n: input 4c + i's high pair in bits 2i, 2i + 1, to bits 4, 5 */
            /* qword m holds outputs 2m, 2m + 1's high bytes at bits 0-7, 8-15; byte j of its result
               takes 8 bits from bit (j < 4 ? 2j - 4 : 2j) mod 64 up, bits 4, 5 the pair wanted */
            const __m512i ctl = _mm512_set1_epi64(0x0a08060402003e3cLL), m30 = _mm512_set1_epi8(0x30);
            const __m512i h0 = _mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)(k->qh + 32 * cc)));
            const __m512i h1 = _mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)(k->qh + 32 * cc + 16)));
            *w0 = _mm512_or_si512(*w0, _mm512_and_si512(_mm512_multishift_epi64_epi8(ctl, h0), m30));
            *w1 = _mm512_or_si512(*w1, _mm512_and_si512(_mm512_multishift_epi64_epi8(ctl, h1), m30));
        }
    } else { /* byte j*16 + n: input j */
        const __m512i i0 = _mm512_set_epi32(
            0x3f2f1f0f, 0x3e2e1e0e, 0x3d2d1d0d, 0x3c2c1c0c, 0x3b2b1b0b, 0x3a2a1a0a, 0x39291909, 0x38281808,
            0x37271707, 0x36261606, 0x35251505, 0x34241404, 0x33231303, 0x32221202, 0x31211101, 0x30201000);
        *w0 = _mm512_permutexvar_epi8(i0, _mm512_loadu_si512((const void *)(k->qs + 128 * cc)));
        *w1 = _mm512_permutexvar_epi8(i0, _mm512_loadu_si512((const void *)(k->qs + 128 * cc + 64)));
        if (L == 1 || L == 3) {
            const __m512i flip = _mm512_set1_epi8((char)0x80);
            *w0 = _mm512_xor_si512(*w0, flip);
            *w1 = _mm512_xor_si512(*w1, flip);
        }
    }
}

static inline __attribute__((always_inline)) void group(const int L, const uint8_t *gw, int64_t nb, const int8_t *xq,
                                                        const float *xd, const float *xs, const int32_t *xt,
                                                        int64_t ldq, int64_t ldb, int64_t ldt, const int R, float *out,
                                                        int64_t ldo) {
    __m512 acc[MAXR];
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    const int two = L == 3 || L == 5;  /* two sums a block, over inputs 0-15 and 16-31 */
    const int off = L == 5 ? 32 : (L == 1 || L == 3) ? 128 : 0;
    for (int64_t b = 0; b < nb; b++) {
        const Block k = block_at(L, gw, b);
        PREFETCH(L, gw, b);
        __m512 A, B;
        if (L < 4) {
            A = _mm512_loadu_ps((const float *)k.blk);
            B = L == 1 ? A : _mm512_loadu_ps((const float *)k.blk + G);
        } else {  /* the products layouts 0 and 3 stored (klayout.h) */
            const __m128i sa = _mm_loadu_si128((const __m128i *)k.sa), sb = _mm_loadu_si128((const __m128i *)k.sb_);
            A = _mm512_mul_ps(_mm512_loadu_ps(k.d), _mm512_cvtepi32_ps(L == 4 ? _mm512_cvtepu8_epi32(sa) : _mm512_cvtepi8_epi32(sa)));
            B = _mm512_mul_ps(_mm512_loadu_ps(k.dm), _mm512_cvtepi32_ps(L == 4 ? _mm512_cvtepu8_epi32(sb) : _mm512_cvtepi8_epi32(sb)));
        }
        __m512i s[MAXR];
        for (int r = 0; r < R; r++) s[r] = _mm512_setzero_si512();
        for (int cc = 0; cc < 4; cc++) {
            __m512i w0, w1;
            quads2(L, &k, cc, &w0, &w1);
            for (int r = 0; r < R; r++) {
                const int8_t *x = xq + r * ldq + b * 32 + 8 * cc;
                int32_t x0, x1;
                memcpy(&x0, x, 4);
                memcpy(&x1, x + 4, 4);
                s[r] = _mm512_dpbusd_epi32(s[r], w0, _mm512_set1_epi32(x0));
                s[r] = _mm512_dpbusd_epi32(s[r], w1, _mm512_set1_epi32(x1));
            }
            if (two && cc == 1) /* inputs 0-15 done: acc = fma(A * d_x, S0, acc), then S1 from zero */
                for (int r = 0; r < R; r++) {
                    const __m512i S0 = _mm512_sub_epi32(s[r], _mm512_set1_epi32(off * xt[r * ldt + 2 * b]));
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(A, _mm512_set1_ps(xd[r * ldb + b])), _mm512_cvtepi32_ps(S0), acc[r]);
                    s[r] = _mm512_setzero_si512();
                }
        }
        for (int r = 0; r < R; r++) {
            const __m512 dx = _mm512_set1_ps(xd[r * ldb + b]);
            if (two) {
                const __m512i S1 = _mm512_sub_epi32(s[r], _mm512_set1_epi32(off * xt[r * ldt + 2 * b + 1]));
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(B, dx), _mm512_cvtepi32_ps(S1), acc[r]);
            } else {
                const __m512i S = off ? _mm512_sub_epi32(s[r], _mm512_set1_epi32(off * (xt[r * ldt + 2 * b] + xt[r * ldt + 2 * b + 1])))
                                      : s[r];
                acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(A, dx), _mm512_cvtepi32_ps(S), acc[r]);
                if (L != 1) acc[r] = _mm512_fmadd_ps(B, _mm512_set1_ps(xs[r * ldb + b]), acc[r]);
            }
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out + r * ldo, acc[r]);
}
#elif defined(__AVX2__)
#define KERNEL_NAME "avx2"
#define MAXR 4
/* inputs 4c .. 4c + 3 of the block's 16 outputs as two vectors (outputs 0-7, 8-15), each
   output's four bytes in input order: the layout holds them input by input */
/* The nibble layouts' (0, 4, 5) inputs 4c, 4c + 2 (a) and 4c + 1, 4c + 3 (b) of the block's 16
   outputs: byte p*16 + n holds input 2p (low nibble) and 2p + 1 (high); layout 5's byte c*16 + n
   holds inputs 4c + i's high pairs in bits 2i, 2i + 1, and its quants are q - 32 */
static inline __attribute__((always_inline)) void nibbles(const int L, const uint8_t *qs, const uint8_t *qh, int c,
                                                          __m256i *a, __m256i *b) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 2 * c * G)), m = _mm256_set1_epi8(15);
    *a = _mm256_and_si256(v, m);                         /* [input 4c | 4c + 2] */
    *b = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);   /* [4c + 1 | 4c + 3] */
    if (L == 5) {
        const __m256i h = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(qh + c * G)));
        const __m256i m30 = _mm256_set1_epi8(0x30), c32 = _mm256_set1_epi8(32);
        const __m256i ha = _mm256_and_si256(_mm256_sllv_epi32(h, _mm256_setr_epi32(4, 4, 4, 4, 0, 0, 0, 0)), m30);
        const __m256i hb = _mm256_and_si256(_mm256_srlv_epi32(_mm256_sllv_epi32(h, _mm256_setr_epi32(2, 2, 2, 2, 0, 0, 0, 0)),
                                                              _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)), m30);
        *a = _mm256_sub_epi8(_mm256_or_si256(*a, ha), c32);
        *b = _mm256_sub_epi8(_mm256_or_si256(*b, hb), c32);
    }
}

static inline __attribute__((always_inline)) void gather4(const int L, const uint8_t *qs, const uint8_t *qh, int c,
                                                          __m256i *lo, __m256i *hi) {
    __m256i a, b;
    if (L == 0 || L == 4 || L == 5) { /* pairs 2c, 2c + 1 */
        nibbles(L, qs, qh, c, &a, &b);
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

/* The nibble layouts' integer sums without gather4's shuffles: unpacking a block's low and high
   nibbles puts inputs 4c, 4c + 1 of outputs 0-7 (8-15) side by side in the low 128 bits and 4c + 2,
   4c + 3 in the high ones, so one _mm256_maddubs_epi16 a row (the row's pairs repeated) gives each
   output two products, summed in int16 over the block (|sum| <= 8 x 2 x 15 x 127 = 30,480; layout
   5, signed as gather4 makes them, over each 16 inputs: <= 4 x 2 x 32 x 127 = 32,512) and widened
   once: the same integers as the general path, so the same bits. */
static inline __attribute__((always_inline)) void nibble_sums(const int L, const Block *k, const int8_t *xq, int64_t ldq,
                                                              const int R, __m256i s0[MAXR][2], __m256i s1[MAXR][2]) {
    const __m256i pairs = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                           2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
    for (int half = 0; half < (L == 5 ? 2 : 1); half++) {
        __m256i t[MAXR][2];
        for (int r = 0; r < R; r++) t[r][0] = t[r][1] = _mm256_setzero_si256();
        for (int c = L == 5 ? 4 * half : 0; c < (L == 5 ? 4 * half + 4 : 8); c++) {
            __m256i a, b;
            nibbles(L, k->qs, k->qh, c, &a, &b);
            const __m256i lo = _mm256_unpacklo_epi8(a, b), hi = _mm256_unpackhi_epi8(a, b);
            const __m256i alo = L == 5 ? _mm256_abs_epi8(lo) : lo, ahi = L == 5 ? _mm256_abs_epi8(hi) : hi;
            for (int r = 0; r < R; r++) {
                int32_t x4;
                memcpy(&x4, xq + r * ldq + 4 * c, 4);
                const __m256i xv = _mm256_shuffle_epi8(_mm256_set1_epi32(x4), pairs);
                t[r][0] = _mm256_add_epi16(t[r][0], _mm256_maddubs_epi16(alo, L == 5 ? _mm256_sign_epi8(xv, lo) : xv));
                t[r][1] = _mm256_add_epi16(t[r][1], _mm256_maddubs_epi16(ahi, L == 5 ? _mm256_sign_epi8(xv, hi) : xv));
            }
        }
        for (int r = 0; r < R; r++)
            for (int h = 0; h < 2; h++) {
                const __m256i S = _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(t[r][h])),
                                                   _mm256_cvtepi16_epi32(_mm256_extracti128_si256(t[r][h], 1)));
                if (half) s1[r][h] = S; else s0[r][h] = S;
            }
    }
}

static inline __attribute__((always_inline)) void group(const int L, const uint8_t *gw, int64_t nb, const int8_t *xq,
                                                        const float *xd, const float *xs, const int32_t *xt,
                                                        int64_t ldq, int64_t ldb, int64_t ldt, const int R, float *out,
                                                        int64_t ldo) {
    (void)xt; (void)ldt;
    __m256 acc[MAXR][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++) {
        const Block k = block_at(L, gw, b);
        PREFETCH(L, gw, b);
        const uint8_t *blk = k.blk, *qs = k.qs;
        __m256i s0[MAXR][2], s1[MAXR][2];
        for (int r = 0; r < R; r++) s0[r][0] = s0[r][1] = s1[r][0] = s1[r][1] = _mm256_setzero_si256();
        if (L == 0 || L == 4 || L == 5) nibble_sums(L, &k, xq + b * 32, ldq, R, s0, s1);
        else for (int c = 0; c < 8; c++) {
            __m256i w[2];
            gather4(L, qs, k.qh, c, &w[0], &w[1]);
            const int sgn = L == 1 || L == 3 || L == 5;  /* signed quants: |w| times x with w's sign */
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
                    if ((L == 3 || L == 5) && c >= 4) s1[r][h] = _mm256_add_epi32(s1[r][h], p32);
                    else s0[r][h] = _mm256_add_epi32(s0[r][h], p32);
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            __m256 A, B;
            if (L < 4) {
                A = _mm256_loadu_ps((const float *)blk + 8 * h);
                B = L == 1 ? A : _mm256_loadu_ps((const float *)blk + G + 8 * h);
            } else {  /* the products layouts 0 and 3 stored (klayout.h) */
                const __m128i sa = _mm_loadl_epi64((const __m128i *)(k.sa + 8 * h));
                const __m128i sb = _mm_loadl_epi64((const __m128i *)(k.sb_ + 8 * h));
                A = _mm256_mul_ps(_mm256_loadu_ps(k.d + 8 * h),
                                  _mm256_cvtepi32_ps(L == 4 ? _mm256_cvtepu8_epi32(sa) : _mm256_cvtepi8_epi32(sa)));
                B = _mm256_mul_ps(_mm256_loadu_ps(k.dm + 8 * h),
                                  _mm256_cvtepi32_ps(L == 4 ? _mm256_cvtepu8_epi32(sb) : _mm256_cvtepi8_epi32(sb)));
            }
            for (int r = 0; r < R; r++) {
                const __m256 dx = _mm256_set1_ps(xd[r * ldb + b]);
                acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(A, dx), _mm256_cvtepi32_ps(s0[r][h]), acc[r][h]);
                if (L == 0 || L == 2 || L == 4)
                    acc[r][h] = _mm256_fmadd_ps(B, _mm256_set1_ps(xs[r * ldb + b]), acc[r][h]);
                else if (L == 3 || L == 5)
                    acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(B, dx), _mm256_cvtepi32_ps(s1[r][h]), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(out + r * ldo + 8 * h, acc[r][h]);
}
#else
#define KERNEL_NAME "c"
#define MAXR 4
static inline void group(const int L, const uint8_t *gw, int64_t nb, const int8_t *xq, const float *xd,
                         const float *xs, const int32_t *xt, int64_t ldq, int64_t ldb, int64_t ldt, const int R,
                         float *out, int64_t ldo) {
    (void)xt; (void)ldt;
    float acc[MAXR][G];
    for (int r = 0; r < R; r++) for (int n = 0; n < G; n++) acc[r][n] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const Block k = block_at(L, gw, b);
        PREFETCH(L, gw, b);
        const uint8_t *qs = k.qs;
        float A[G], B[G];
        for (int n = 0; n < G; n++) {
            if (L < 4) {
                A[n] = ((const float *)k.blk)[n];
                B[n] = L == 1 ? A[n] : ((const float *)k.blk)[G + n];
            } else {
                A[n] = k.d[n] * (L == 4 ? (float)k.sa[n] : (float)(int8_t)k.sa[n]);
                B[n] = k.dm[n] * (L == 4 ? (float)k.sb_[n] : (float)(int8_t)k.sb_[n]);
            }
        }
        for (int n = 0; n < G; n++) {
            int w[32];
            for (int j = 0; j < 32; j++) {
                if (L == 0 || L == 4 || L == 5)
                    w[j] = j & 1 ? qs[(j / 2) * G + n] >> 4 : qs[(j / 2) * G + n] & 15;
                else
                    w[j] = (int8_t)qs[j * G + n];
                if (L == 5) w[j] = (w[j] | (((k.qh[(j / 4) * G + n] >> (2 * (j % 4))) & 3) << 4)) - 32;
            }
            for (int r = 0; r < R; r++) {
                const int8_t *x = xq + r * ldq + b * 32;
                int S0 = 0, S1 = 0;
                for (int j = 0; j < 16; j++) S0 += w[j] * x[j];
                for (int j = 16; j < 32; j++) S1 += w[j] * x[j];
                const float dx = xd[r * ldb + b];
                if (L == 3 || L == 5) {
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

typedef void (*group_fn)(const uint8_t *, int64_t, const int8_t *, const float *, const float *, const int32_t *,
                         int64_t, int64_t, int64_t, float *, int64_t);
#define SPECIALISE(L, R) static void group_##L##_##R(const uint8_t *g, int64_t nb, const int8_t *q, const float *d, \
        const float *s, const int32_t *t, int64_t ldq, int64_t ldb, int64_t ldt, float *o, int64_t ldo) { \
        group(L, g, nb, q, d, s, t, ldq, ldb, ldt, R, o, ldo); }
#if MAXR == 8
#define ALL(L) SPECIALISE(L, 1) SPECIALISE(L, 2) SPECIALISE(L, 3) SPECIALISE(L, 4) SPECIALISE(L, 5) SPECIALISE(L, 6) \
        SPECIALISE(L, 7) SPECIALISE(L, 8)
#define ROW(L) {0, group_##L##_1, group_##L##_2, group_##L##_3, group_##L##_4, group_##L##_5, group_##L##_6, \
        group_##L##_7, group_##L##_8}
#else
#define ALL(L) SPECIALISE(L, 1) SPECIALISE(L, 2) SPECIALISE(L, 3) SPECIALISE(L, 4)
#define ROW(L) {0, group_##L##_1, group_##L##_2, group_##L##_3, group_##L##_4}
#endif
ALL(0)
ALL(1)
ALL(2)
ALL(3)
ALL(4)
ALL(5)
static const group_fn group_fns[NLAYOUTS][MAXR + 1] = {ROW(0), ROW(1), ROW(2), ROW(3), ROW(4), ROW(5)};

const char *tttr_q8_kernel(void) { return KERNEL_NAME; }

/* The rows x[M, K] quantized as kind (0 Q8_0, 1 Q8_1, 2 Q8_K): q [M, K], d and s [M, K/32]. */
int tttr_q8_quantize(int kind, const float *x, int64_t M, int64_t K, int8_t *q, float *d, float *s) {
    if (kind < 0 || kind > 2 || K % (kind == 2 ? 256 : 32) || M < 0) return 1;
    for (int64_t r = 0; r < M; r++) quantize_row(kind, x + r * K, K, q + r * K, d + r * (K / 32), s + r * (K / 32));
    return 0;
}

/* The activations one call needs: per kind (Q8_0, Q8_1, Q8_K) that a part asks for, all M rows
   quantized (quants [M, K], scales and sums [M, K/32]), in one allocation. */
typedef struct { int8_t *q[3]; float *d[3], *s[3]; int32_t *t[3]; void *mem; } acts;

static int acts_alloc(acts *a, const int need[3], int64_t M, int64_t K) {
    const int64_t nb = K / 32;
    size_t bytes = 0;
    for (int k = 0; k < 3; k++) if (need[k]) bytes += (size_t)(M * K) + 4 * sizeof(float) * (size_t)(M * nb);
    a->mem = malloc(bytes ? bytes : 1);
    if (!a->mem) return 1;
    float *f = (float *)a->mem;
    for (int k = 0; k < 3; k++) {
        if (!need[k]) { a->q[k] = 0; a->d[k] = a->s[k] = 0; a->t[k] = 0; continue; }
        a->d[k] = f; a->s[k] = f + M * nb; a->t[k] = (int32_t *)(f + 2 * M * nb); f += 4 * M * nb;
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
        fns[R](gw, nb, a->q[k] + r0 * K, a->d[k] + r0 * nb, a->s[k] + r0 * nb, a->t[k] + r0 * 2 * nb, K, nb, 2 * nb,
               out + r0 * N + g * G, N);
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
        if (ns[i] % G || L >= NLAYOUTS || (L >= 4 && K % 256) || k < 0 || k > 2 || (k == 2 && K % 256)) return 1;
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
                    for (int64_t r = 0; r < M; r++) {
                        quantize_row(k, x + r * K, K, a.q[k] + r * K, a.d[k] + r * nb, a.s[k] + r * nb);
                        sums16(a.q[k] + r * K, K, a.t[k] + r * 2 * nb);
                    }
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
            for (int64_t r = 0; r < M; r++) {
                quantize_row(k, x + r * K, K, a.q[k] + r * K, a.d[k] + r * nb, a.s[k] + r * nb);
                sums16(a.q[k] + r * K, K, a.t[k] + r * 2 * nb);
            }
        }
        #pragma omp for schedule(static)
        for (int64_t g = 0; g < groups; g++) one_group(g, nparts, first, formats, ws, nb, K, &a, M, out, N);
    }
    free(a.mem);
    return 0;
}
