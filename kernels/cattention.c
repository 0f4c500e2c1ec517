
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "exp_neg.h"

/* y[i] += a * x[i], element by element (restrict: so the compiler vectorises it) */
static inline void axpy(float *restrict y, const float *restrict x, const float a, const int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* o_d = (sum over j = 0..L-1, one by one, of p_j * v_j,d) / denom. The accumulators stay in
   registers for a head dim of 64 or 128 (a loop over memory would wait on a store every key);
   the same fused multiply-adds in the same order either way. */
static inline void weighted_values(const float *restrict p, const float *restrict vb, const int64_t v_row,
                                   const int64_t L, const int64_t D, const float denom, float *restrict o) {
#if defined(__AVX512F__)
#define WV(NV) do { \
        __m512 acc[NV]; \
        for (int t = 0; t < NV; t++) acc[t] = _mm512_setzero_ps(); \
        for (int64_t j = 0; j < L; j++) { \
            const __m512 pj = _mm512_set1_ps(p[j]); \
            for (int t = 0; t < NV; t++) acc[t] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vb + j * v_row + 16 * t), acc[t]); \
        } \
        const __m512 dn = _mm512_set1_ps(denom); \
        for (int t = 0; t < NV; t++) _mm512_storeu_ps(o + 16 * t, _mm512_div_ps(acc[t], dn)); \
        return; \
    } while (0)
    if (D == 64) WV(4);
    if (D == 128) WV(8);
#undef WV
#elif defined(__AVX2__) && defined(__FMA__)
#define WV(NV) do { \
        __m256 acc[NV]; \
        for (int t = 0; t < NV; t++) acc[t] = _mm256_setzero_ps(); \
        for (int64_t j = 0; j < L; j++) { \
            const __m256 pj = _mm256_set1_ps(p[j]); \
            for (int t = 0; t < NV; t++) acc[t] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vb + j * v_row + 8 * t), acc[t]); \
        } \
        const __m256 dn = _mm256_set1_ps(denom); \
        for (int t = 0; t < NV; t++) _mm256_storeu_ps(o + 8 * t, _mm256_div_ps(acc[t], dn)); \
        return; \
    } while (0)
    if (D == 64) WV(8);
    if (D == 128) WV(16);
#undef WV
#endif
    float acc[D];
    for (int64_t d = 0; d < D; d++) acc[d] = 0.0f;
    for (int64_t j = 0; j < L; j++) axpy(acc, vb + j * v_row, p[j], D);
    for (int64_t d = 0; d < D; d++) o[d] = acc[d] / denom;
}

/* The score of one key: lane l of 16 sums q_d * k_d for d = l, l+16, l+32, ... in order, then
   the lanes are added pairwise (l += l+8, l += l+4, l += l+2, l += l+1). Vectorises along the
   head dim as written; the scalar form gives the same bits. */
static inline float dot_lanes(const float *restrict q, const float *restrict k, const int64_t D) {
#if defined(__AVX512F__)
    if (D % 16 == 0) {  /* the same fused multiply-adds and the same tree, in vector registers */
        __m512 acc = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), acc);
        __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
        __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
        __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
        __m128 a1 = _mm_add_ss(a2, _mm_shuffle_ps(a2, a2, 1));
        return _mm_cvtss_f32(a1);
    }
#elif defined(__AVX2__) && defined(__FMA__)
    if (D % 16 == 0) {  /* lanes 0-7 and 8-15 in two vectors: the same fused multiply-adds and tree */
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d += 16) {
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), lo);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), hi);
        }
        const __m256 a8 = _mm256_add_ps(lo, hi);
        __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a8), _mm256_extractf128_ps(a8, 1));
        __m128 a2 = _mm_add_ps(a4, _mm_movehl_ps(a4, a4));
        __m128 a1 = _mm_add_ss(a2, _mm_shuffle_ps(a2, a2, 1));
        return _mm_cvtss_f32(a1);
    }
#endif
    float lane[16] = {0};
    int64_t d = 0;
    for (; d + 16 <= D; d += 16)
        for (int l = 0; l < 16; l++) lane[l] += q[d + l] * k[d + l];
    for (; d < D; d++) lane[d % 16] += q[d] * k[d];
    for (int w = 8; w > 0; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    return lane[0];
}

#if defined(__AVX512F__)
/* The scores of 16 consecutive keys at once, each exactly as dot_lanes computes it: the same
   fused multiply-adds into one vector per key, then the same pairwise tree done for 16 keys
   together by shuffles (level 1 adds lane l+8 to lane l, then l+4, l+2, l+1), and the 16 sums
   put back in key order. */
static inline void scores16(const float *restrict q, const float *restrict k, const int64_t k_row,
                            const int64_t D, const float scale, float *restrict s) {
    __m512 a[16], z[8], w[4], v[2];
    for (int t = 0; t < 16; t++) a[t] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
        const __m512 qd = _mm512_loadu_ps(q + d);
        for (int t = 0; t < 16; t++) a[t] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(k + t * k_row + d), a[t]);
    }
    for (int p = 0; p < 8; p++)  /* keys 2p | 2p+1, lanes 0-7 each: l + (l+8) */
        z[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE));
    for (int r = 0; r < 4; r++)  /* keys 4r..4r+3, a quarter each: l + (l+4) */
        w[r] = _mm512_add_ps(_mm512_shuffle_f32x4(z[2 * r], z[2 * r + 1], 0x88),
                             _mm512_shuffle_f32x4(z[2 * r], z[2 * r + 1], 0xDD));
    for (int h = 0; h < 2; h++)  /* l + (l+2) */
        v[h] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * h], w[2 * h + 1], 0x44),
                             _mm512_shuffle_ps(w[2 * h], w[2 * h + 1], 0xEE));
    /* l0 + l1: lane 4i + m holds key 4m + i */
    const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_storeu_ps(s, _mm512_mul_ps(_mm512_permutexvar_ps(order, u), _mm512_set1_ps(scale)));
}
#endif

/* Query i, head h: the same loops whichever thread runs it. */
static inline float head_weights(const float *qh, const float *kb, int64_t k_row, int64_t L, int64_t D,
                                 float scale, float *restrict s);

static inline void one_head(const float *q, const float *k, const float *v, int64_t k_seq, int64_t k_row,
                            int64_t v_seq, int64_t v_row, const int64_t *seq, const int64_t *pos, int64_t i,
                            int64_t h, int64_t H, int64_t G, int64_t D, float scale, float *out) {
    const int64_t L = pos[i] + 1, g = h / G, sq = seq[i];
    const float *kb = k + sq * k_seq + g * D, *vb = v + sq * v_seq + g * D;
    float s[L];
    const float denom = head_weights(q + (i * H + h) * D, kb, k_row, L, D, scale, s);
    weighted_values(s, vb, v_row, L, D, denom, out + (i * H + h) * D);
}

/* The softmax weights of query i, head h, over keys 0..L-1 into s, as one_head computes them;
   returns their denominator. */
static inline float head_weights(const float *qh, const float *kb, int64_t k_row, int64_t L, int64_t D,
                                 float scale, float *restrict s) {
    int64_t j = 0;
#if !defined(TTTR_ONE_KEY) && defined(__AVX512F__)
    if (D % 16 == 0)
        for (; j + 16 <= L; j += 16) scores16(qh, kb + j * k_row, k_row, D, scale, s + j);
#endif
    for (; j < L; j++) s[j] = dot_lanes(qh, kb + j * k_row, D) * scale;
    float m = -INFINITY;
    for (int64_t j = 0; j < L; j++) m = s[j] > m ? s[j] : m;
    for (int64_t j = 0; j < L; j++) s[j] = exp_neg(s[j] - m);
    float denom = 0.0f;
    for (int64_t j = 0; j < L; j++) denom += s[j];
    return denom;
}

#if !defined(TTTR_ONE_KEY) && defined(__AVX512F__)
/* Query i, the GN heads h0..h0+GN-1 that share one KV head, head dim 64: each head's weights as
   one_head's, then the weighted values of all GN heads in one pass over the values, each head's
   four accumulators updated in the same order as weighted_values updates them (the same bits).
   One load of a value row serves GN heads, and 4 GN independent chains of fused multiply-adds
   replace one_head's 4, whose latency bound it at long prompts. */
static inline __attribute__((always_inline)) void head_group64(
        const float *q, const float *k, const float *v, int64_t k_seq, int64_t k_row, int64_t v_seq, int64_t v_row,
        const int64_t *seq, const int64_t *pos, int64_t i, int64_t h0, int64_t H, int64_t G, float scale,
        float *out, float *s, const int GN) {
    const int64_t L = pos[i] + 1, g = h0 / G, sq = seq[i], D = 64;
    const float *kb = k + sq * k_seq + g * D, *vb = v + sq * v_seq + g * D;
    float denom[4];
    for (int t = 0; t < GN; t++) denom[t] = head_weights(q + (i * H + h0 + t) * D, kb, k_row, L, D, scale, s + t * L);
    __m512 acc[4][4];
    for (int t = 0; t < GN; t++)
        for (int u = 0; u < 4; u++) acc[t][u] = _mm512_setzero_ps();
    for (int64_t j = 0; j < L; j++) {
        const float *vj = vb + j * v_row;
        const __m512 v0 = _mm512_loadu_ps(vj), v1 = _mm512_loadu_ps(vj + 16), v2 = _mm512_loadu_ps(vj + 32),
                     v3 = _mm512_loadu_ps(vj + 48);
        for (int t = 0; t < GN; t++) {
            const __m512 pj = _mm512_set1_ps(s[t * L + j]);
            acc[t][0] = _mm512_fmadd_ps(pj, v0, acc[t][0]);
            acc[t][1] = _mm512_fmadd_ps(pj, v1, acc[t][1]);
            acc[t][2] = _mm512_fmadd_ps(pj, v2, acc[t][2]);
            acc[t][3] = _mm512_fmadd_ps(pj, v3, acc[t][3]);
        }
    }
    for (int t = 0; t < GN; t++) {
        const __m512 dn = _mm512_set1_ps(denom[t]);
        float *o = out + (i * H + h0 + t) * D;
        for (int u = 0; u < 4; u++) _mm512_storeu_ps(o + 16 * u, _mm512_div_ps(acc[t][u], dn));
    }
}
#endif

/* How many heads of a KV group one work item takes: 1 (one_head), or 2-4 heads of a group at
   once (head_group64) where the build and the head dim allow it and there are enough items to
   keep every thread busy. Either way every output has the same bits. */
static int64_t group_width(int64_t n, int64_t H, int64_t G, int64_t D, int64_t n_keys, int threads) {
#if !defined(TTTR_ONE_KEY) && defined(__AVX512F__)
    if (D != 64 || n_keys > 16384) return 1;  /* the weights of 4 heads stay a few hundred KiB of stack */
    for (int64_t gn = 4; gn >= 2; gn--)
        if (G % gn == 0 && n * (H / gn) >= 8 * (int64_t)threads) return gn;
#endif
    (void)n; (void)H; (void)G; (void)D; (void)n_keys; (void)threads;
    return 1;
}

static inline void work_item(const float *q, const float *k, const float *v, int64_t k_seq, int64_t k_row,
                             int64_t v_seq, int64_t v_row, const int64_t *seq, const int64_t *pos, int64_t u,
                             int64_t gw, int64_t H, int64_t G, int64_t D, float scale, float *out) {
    const int64_t per = H / gw, i = u / per, h0 = (u % per) * gw;
#if !defined(TTTR_ONE_KEY) && defined(__AVX512F__)
    if (gw > 1) {
        float s[gw * (pos[i] + 1)];
        if (gw == 4) head_group64(q, k, v, k_seq, k_row, v_seq, v_row, seq, pos, i, h0, H, G, scale, out, s, 4);
        else if (gw == 3) head_group64(q, k, v, k_seq, k_row, v_seq, v_row, seq, pos, i, h0, H, G, scale, out, s, 3);
        else head_group64(q, k, v, k_seq, k_row, v_seq, v_row, seq, pos, i, h0, H, G, scale, out, s, 2);
        return;
    }
#endif
    one_head(q, k, v, k_seq, k_row, v_seq, v_row, seq, pos, i, h0, H, G, D, scale, out);
}

/* Query i (row i of q [n, H, D], contiguous) attends keys 0..pos[i] of sequence seq[i] (of
   n_seq); key j of KV head g starts at k + seq[i]*k_seq + j*k_row + g*D (v likewise).
   out: [n, H, D]. Keys and values are read in place. Called from inside an active OpenMP
   parallel region (the compiled decode step's), by every thread of its team with the same
   arguments, each thread computes its share of the (query, head) pairs and returns without
   waiting for the others (`threads` is not read): the caller synchronises. Otherwise the call
   opens a region of `threads` threads of its own. */
int tttr_attention(const float *q, const float *k, const float *v,
                   int64_t k_seq, int64_t k_row, int64_t v_seq, int64_t v_row,
                   const int64_t *seq, const int64_t *pos, int64_t n, int64_t n_seq, int64_t n_keys,
                   int64_t H, int64_t KVH, int64_t D, float scale, float *out, int threads)
{
    const int64_t G = H / KVH;
    for (int64_t i = 0; i < n; i++) {  /* never read outside the tensors given */
        if (seq[i] < 0 || seq[i] >= n_seq) return 1;
        if (pos[i] < 0 || pos[i] >= n_keys) return 2;
    }
    if (omp_in_parallel()) {
        const int64_t gw = group_width(n, H, G, D, n_keys, omp_get_num_threads()), items = n * (H / gw);
        #pragma omp for schedule(static) nowait
        for (int64_t u = 0; u < items; u++) work_item(q, k, v, k_seq, k_row, v_seq, v_row, seq, pos, u, gw, H, G, D, scale, out);
        return 0;
    }
    const int64_t gw = group_width(n, H, G, D, n_keys, threads), items = n * (H / gw);
    #pragma omp parallel for schedule(dynamic, 4) num_threads(threads)
    for (int64_t u = 0; u < items; u++) work_item(q, k, v, k_seq, k_row, v_seq, v_row, seq, pos, u, gw, H, G, D, scale, out);
    return 0;
}
