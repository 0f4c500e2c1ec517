
#include <math.h>
#include <stdint.h>

#define L 16

static inline float sum_squares(const float *x, int64_t d) {
    float acc[L] = {0};
    int64_t i = 0;
    for (; i + L <= d; i += L)
        for (int l = 0; l < L; l++) acc[l] += x[i + l] * x[i + l];
    for (; i < d; i++) acc[i % L] += x[i] * x[i];
    for (int w = L / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

static inline void norm_row(const float *x, const float *w, float *y, int64_t d, float eps) {
    const float r = 1.0f / sqrtf(sum_squares(x, d) / (float)d + eps);
    for (int64_t i = 0; i < d; i++) y[i] = (x[i] * r) * w[i];
}

/* y[rows, d] = rms_norm(x) * w */
void tttr_rms_norm(const float *x, const float *w, float *y, int64_t rows, int64_t d, float eps) {
    for (int64_t r = 0; r < rows; r++) norm_row(x + r * d, w, y + r * d, d, eps);
}

/* x += delta (in place), then y = rms_norm(x) * w */
void tttr_add_rms_norm(float *x, const float *delta, const float *w, float *y, int64_t rows, int64_t d, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * d;
        const float *dr = delta + r * d;
        for (int64_t i = 0; i < d; i++) xr[i] = xr[i] + dr[i];
        norm_row(xr, w, y + r * d, d, eps);
    }
}

/* Rotate heads 0..heads-1 of each row in place: row r starts at x + r * row_stride, head h at
   + h * d; cos/sin tables [positions, d], row pos[r]. Returns 1 if a position is out of range. */
int tttr_rope(float *x, int64_t rows, int64_t row_stride, int64_t heads, int64_t d,
              const float *cos_t, const float *sin_t, int64_t n_pos, const int64_t *pos) {
    const int64_t half = d / 2;
    float tmp[d];
    for (int64_t r = 0; r < rows; r++) {
        if (pos[r] < 0 || pos[r] >= n_pos) return 1;
        const float *c = cos_t + pos[r] * d, *s = sin_t + pos[r] * d;
        for (int64_t h = 0; h < heads; h++) {
            float *v = x + r * row_stride + h * d;
            for (int64_t i = 0; i < d; i++) tmp[i] = v[i];
            for (int64_t i = 0; i < half; i++) v[i] = tmp[i] * c[i] + tmp[i + half] * s[i];
            for (int64_t i = half; i < d; i++) v[i] = tmp[i] * c[i] + tmp[i - half] * s[i];
        }
    }
    return 0;
}

#include "exp_neg.h"

/* y[r, i] = silu(gu[r, i]) * gu[r, f + i] for gu [rows, 2f] (gate then up), y [rows, f] */
void tttr_silu_mul(const float *gu, float *y, int64_t rows, int64_t f) {
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * f, *u = g + f;
        float *yr = y + r * f;
        for (int64_t i = 0; i < f; i++) {
            const float e = exp_neg(g[i] < 0.0f ? g[i] : -g[i]);
            const float s = (g[i] < 0.0f ? e : 1.0f) / (1.0f + e);
            yr[i] = g[i] * s * u[i];
        }
    }
}

/* The k largest of each row, largest first, the lower index first among equals (k <= 64);
   NaNs are skipped (a row with fewer than k others pads with -inf at index -1). */
void tttr_topk(const float *x, int64_t n, int64_t m, int64_t k, float *vals, int64_t *idx, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * m;
        float v[64];
        int64_t id[64];
        int64_t have = 0;
        for (int64_t i = 0; i < m; i++) {
            const float xi = xr[i];
            if (xi != xi || (have == k && !(xi > v[k - 1]))) continue;
            int64_t j = have < k ? have++ : k - 1;
            while (j > 0 && xi > v[j - 1]) { v[j] = v[j - 1]; id[j] = id[j - 1]; j--; }
            v[j] = xi; id[j] = i;
        }
        for (int64_t j = 0; j < k; j++) {
            vals[r * k + j] = j < have ? v[j] : -INFINITY;
            idx[r * k + j] = j < have ? id[j] : -1;
        }
    }
}

/* Inverse CDF for each of n rows of probs [n, m] (unnormalised): the first index i whose
   running sum, accumulated in double one entry after another, exceeds u[r] times the whole
   row's sum so accumulated; clamped to m - 1. The same index as torch.searchsorted(
   torch.cumsum(probs.double(), -1), u * total, right=True), without the cumulative array. */
void tttr_draw(const float *probs, const double *u, int64_t n, int64_t m, int64_t *out, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < n; r++) {
        const float *p = probs + r * m;
        double total = 0.0;
        for (int64_t i = 0; i < m; i++) total += (double)p[i];
        const double target = u[r] * total;
        double c = 0.0;
        int64_t i = 0;
        for (; i < m; i++) {
            c += (double)p[i];
            if (c > target) break;
        }
        out[r] = i < m ? i : m - 1;
    }
}

/* exp(x_i - max) summed in double, lane l of 16 taking i = l, l+16, ... in order, the lanes
   added in a fixed pairwise tree; e (when not 0) receives the exponentials. */
static inline double sum_exp(const float *x, int64_t m, float mx, float *e) {
    double acc[L] = {0};
    int64_t i = 0;
    for (; i + L <= m; i += L)
        for (int l = 0; l < L; l++) {
            const float v = exp_neg(x[i + l] - mx);
            if (e) e[i + l] = v;
            acc[l] += (double)v;
        }
    for (; i < m; i++) {
        const float v = exp_neg(x[i] - mx);
        if (e) e[i] = v;
        acc[i % L] += (double)v;
    }
    for (int w = L / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

static inline float row_max(const float *x, int64_t m) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < m; i++) mx = x[i] > mx ? x[i] : mx;
    return mx;
}

/* y = log_softmax(x) for each of n rows of m: (x_i - max) - log(sum_exp), each row on its own */
void tttr_log_softmax(const float *x, float *y, int64_t n, int64_t m, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * m;
        const float mx = row_max(xr, m);
        const float lse = (float)log(sum_exp(xr, m, mx, 0));
        for (int64_t i = 0; i < m; i++) y[r * m + i] = (xr[i] - mx) - lse;
    }
}

/* y = softmax(x) for each of n rows of m: exp(x_i - max) / their sum */
void tttr_softmax(const float *x, float *y, int64_t n, int64_t m, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t r = 0; r < n; r++) {
        float *yr = y + r * m;
        const float total = (float)sum_exp(x + r * m, m, row_max(x + r * m, m), yr);
        for (int64_t i = 0; i < m; i++) yr[i] = yr[i] / total;
    }
}
