"""The decoder's row-local steps as compiled C (built on first use, cached, called through
ctypes): RMSNorm (alone and fused with the residual add before it), rotary embedding in
place, and SwiGLU. At decode sizes each was several PyTorch ops of a few microseconds'
dispatch on a few hundred numbers; one call each costs about one dispatch.

Each row is computed on its own, in an order fixed by the row's length alone, so these are
batch-invariant as they stand and serve both kernel modes:

- rms_norm: lane l of 16 sums x_i * x_i for i = l, l+16, l+32, ... in order (products rounded,
  then added: compiled without contraction), the 16 lanes are added in a fixed pairwise tree,
  r = 1 / sqrt(sum / D + eps), y_i = (x_i * r) * w_i;
- rotary: y_i = x_i * cos_i + x_(i+D/2 mod D) * sin'_i (sin' with its first half negated: the
  model's tables), three rounded operations as in the PyTorch formulation, same bits;
- topk: one scan a row keeping the k largest (3x torch.topk on the vocabulary here);
- draw: a sampler's inverse CDF, summed in double entry by entry as torch.cumsum does;
- silu_mul: g * sigmoid(g) * u with sigmoid from one exp of -|g| (Cephes' polynomial, plain
  float arithmetic the compiler vectorises: vector body and scalar tail agree).

Without a compiler or with `TTTR_NO_C_KERNELS=1`, `available()` is False and kernels.ops keeps
the PyTorch formulations.

Importing this module does not import torch (the torch-free generation path,
engine/inference/lite.py, calls the library through `load()` with numpy arrays); the
wrappers below import it when called."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ctypes

from tttr.kernels.cattention import EXP_NEG
from tttr.sessions.cache import CLibrary

if TYPE_CHECKING:  # the wrappers import torch when called: the torch-free path never does
    import torch

SOURCE = r"""
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

""" + EXP_NEG + r"""
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
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-fast-math", "-fno-trapping-math", "-ffp-contract=off", "-shared", "-fPIC"]


def _declare(lib) -> None:
    p, i, f = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.tttr_rms_norm.argtypes = [p, p, p, i, i, f]
    lib.tttr_add_rms_norm.argtypes = [p, p, p, p, i, i, f]
    lib.tttr_rope.argtypes = [p, i, i, i, i, p, p, i, p]
    lib.tttr_rope.restype = ctypes.c_int
    lib.tttr_silu_mul.argtypes = [p, p, i, i]
    lib.tttr_draw.argtypes = [p, p, i, i, p, ctypes.c_int]
    lib.tttr_topk.argtypes = [p, i, i, i, p, p, ctypes.c_int]
    lib.tttr_log_softmax.argtypes = lib.tttr_softmax.argtypes = [p, p, i, i, ctypes.c_int]
    for fn in (lib.tttr_rms_norm, lib.tttr_add_rms_norm, lib.tttr_silu_mul, lib.tttr_draw, lib.tttr_topk,
               lib.tttr_log_softmax, lib.tttr_softmax):
        fn.restype = None


_library = CLibrary("rowwise", SOURCE, _FLAGS, "the compiled row-local kernels", _declare)
load, available, why_unavailable = _library.load, _library.available, _library.why_unavailable


def _rows(x: torch.Tensor) -> torch.Tensor:
    import torch

    if x.dtype != torch.float32 or not x.is_contiguous():
        raise ValueError("row-local kernels take contiguous fp32 tensors")
    return x


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    import torch

    d = x.shape[-1]
    x, w = _rows(x), _rows(weight)
    y = torch.empty_like(x)
    load().tttr_rms_norm(x.data_ptr(), w.data_ptr(), y.data_ptr(), x.numel() // d, d, eps)
    return y


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x += delta in place; returns rms_norm(x) * weight."""
    import torch

    d = x.shape[-1]
    x, delta, w = _rows(x), _rows(delta), _rows(weight)
    if delta.shape != x.shape:
        raise ValueError(f"add_rms_norm: {tuple(delta.shape)} added to {tuple(x.shape)}")
    y = torch.empty_like(x)
    load().tttr_add_rms_norm(x.data_ptr(), delta.data_ptr(), w.data_ptr(), y.data_ptr(), x.numel() // d, d, eps)
    return y


def rope_(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> None:
    """Rotate the first `heads` heads of x [R, >= heads, D] (heads contiguous, rows any stride)
    in place by the table rows cos/sin [P, D] at `positions` [R] (int64)."""
    import torch

    r, _, d = x.shape
    if x.dtype != torch.float32 or x.stride(2) != 1 or x.stride(1) != d:
        raise ValueError("rope_: heads must be contiguous fp32 rows")
    cos, sin, positions = _rows(cos), _rows(sin), positions.to(torch.int64).contiguous()
    if load().tttr_rope(x.data_ptr(), r, x.stride(0), heads, d, cos.data_ptr(), sin.data_ptr(), cos.shape[0],
                        positions.data_ptr()):
        raise ValueError(f"rope_: a position is past the {cos.shape[0]}-row table")


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [R, 2F] (gate then up) -> silu(gate) * up [R, F]."""

    gate_up = _rows(gate_up)
    r, f2 = gate_up.shape
    y = gate_up.new_empty(r, f2 // 2)
    load().tttr_silu_mul(gate_up.data_ptr(), y.data_ptr(), r, f2 // 2)
    return y


def draw(probs: torch.Tensor, u: torch.Tensor) -> list[int]:
    """probs [n, m] fp32 (unnormalised), u [n] float64 in [0, 1): each row's inverse-CDF index
    (see tttr_draw), rows in parallel."""
    import torch

    probs, u = _rows(probs), u.to(torch.float64).contiguous()
    n, m = probs.shape
    out = torch.empty(n, dtype=torch.int64)
    load().tttr_draw(probs.data_ptr(), u.data_ptr(), n, m, out.data_ptr(), torch.get_num_threads())
    return out.tolist()


TOPK_MAX = 64


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest of each row of a 2-D fp32 tensor, largest first
    (the lower index first among equals), like torch.topk(x, k) for k <= TOPK_MAX."""
    import torch

    x = _rows(x)
    n, m = x.shape
    if not 0 < k <= min(m, TOPK_MAX):
        raise ValueError(f"topk: k={k} must be in 1..{min(m, TOPK_MAX)}")
    vals = torch.empty(n, k, dtype=torch.float32)
    idx = torch.empty(n, k, dtype=torch.int64)
    load().tttr_topk(x.data_ptr(), n, m, k, vals.data_ptr(), idx.data_ptr(), torch.get_num_threads())
    return vals, idx


def log_softmax(x: "torch.Tensor") -> "torch.Tensor":
    """log_softmax of each row of a 2-D fp32 tensor (tttr_log_softmax: each row on its own,
    in an order fixed by its length; the invariant mode's CPU log-softmax)."""
    import torch

    x = _rows(x)
    y = torch.empty_like(x)
    load().tttr_log_softmax(x.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], torch.get_num_threads())
    return y


def softmax(x: "torch.Tensor") -> "torch.Tensor":
    """softmax of each row of a 2-D fp32 tensor (tttr_softmax, as log_softmax)."""
    import torch

    x = _rows(x)
    y = torch.empty_like(x)
    load().tttr_softmax(x.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], torch.get_num_threads())
    return y
