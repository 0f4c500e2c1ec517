"""A decode step's layers in one compiled call: the per-op path's kernels, driven from C.

When every row of a pass decodes one token (a single stream, or the engine's running
sequences each at their next position), `Model.forward` spends most of a step on Python
between kernels: each of a layer's ten ops is a ctypes call plus tensor allocation and
views, about 4 ms a step for the default model's 30 layers. `decode` runs all the layers
in one call instead: C code that calls the very same compiled functions the per-op path
calls (kernels.crow's norms, rotary and SwiGLU, kernels.cquant's block products,
kernels.cattention's attention, reached through their function pointers) on the same
inputs in the same order, and does the rest itself (copies, and the bias add, one
rounding as in PyTorch). So its results are the per-op path's bits, in every kernel
mode (on this path `fast` and `invariant` run those same compiled kernels, and
`invariant-q8` the same with kernels.cq8's 8-bit-activation products in place of
cquant's: one function pointer, the same arguments, the parts' layouts carrying their
activation kinds), and it is batch-invariant exactly as they are.

Per layer: qkv product (+ bias) (-> Qwen3's RMSNorm of each query and key head) -> rotary on the query and key heads -> the new key and
value written to the cache -> attention -> o product -> residual add + norm -> gate/up
product -> SwiGLU -> down product -> residual add + the next norm. The embedding before and
the head after stay in `Model.forward`.

It applies (`decode` returns None otherwise and the model runs its ops one by one) to fp32
models whose layer products are all block weights (under `invariant-q8`, all of types
kernels.cq8 takes, when it is built) and whose layers hold nothing else the
per-op path would use, when the compiled kernels are there, and to passes
whose rows each decode one token, in caches that are slots of one KV pool or in one
sequence's own cache.

Importing this module does not import torch: the torch-free generation path
(engine/inference/lite.py) makes a `_Plan` of its numpy-held model and calls `tttr_decode`
itself; `_plan` and `decode` import torch when called."""

from __future__ import annotations

from typing import TYPE_CHECKING

import ctypes
import weakref

from tttr.kernels import cattention, cq8, cquant, crow
from tttr.sessions.cache import CLibrary

if TYPE_CHECKING:  # the wrappers import torch when called: the torch-free path never does
    import torch

SOURCE = r"""
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#else
#include <sched.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PAUSE() _mm_pause()
#else
#define PAUSE() do { } while (0)
#endif

/* The barrier between a pass's stages: spin up to SPIN_NS, then sleep (a futex) until the last
   thread arrives. On a quiet machine the threads meet within microseconds and never sleep; on
   a loaded one a thread whose partner was descheduled gives its core back instead of spinning
   for milliseconds (OpenMP's own barrier spins for ~300,000 pauses first). */
#define SPIN_NS 50000
typedef struct { int count, gen, sleepers; } Barrier;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void barrier_wait(Barrier *b, int n) {
    if (n <= 1) return;
    const int gen = __atomic_load_n(&b->gen, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&b->count, 1, __ATOMIC_ACQ_REL) == n) {  /* the last to arrive opens it */
        __atomic_store_n(&b->count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&b->gen, gen + 1, __ATOMIC_SEQ_CST);
#if defined(__linux__)
        if (__atomic_load_n(&b->sleepers, __ATOMIC_SEQ_CST))
            syscall(SYS_futex, &b->gen, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
#endif
        return;
    }
    const int64_t until = now_ns() + SPIN_NS;
    for (int i = 1;; i++) {
        if (__atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) != gen) return;
        PAUSE();
        if (i % 64 == 0 && now_ns() > until) break;
    }
#if defined(__linux__)
    __atomic_add_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&b->gen, __ATOMIC_SEQ_CST) == gen)
        syscall(SYS_futex, &b->gen, FUTEX_WAIT_PRIVATE, gen, NULL, NULL, 0);
    __atomic_sub_fetch(&b->sleepers, 1, __ATOMIC_SEQ_CST);
#else
    while (__atomic_load_n(&b->gen, __ATOMIC_ACQUIRE) == gen) sched_yield();
#endif
}

typedef int (*qparts_fn)(int, const int *, const uint8_t *const *, const int64_t *, int64_t, const float *, int64_t,
                         float *, int);
typedef int (*qone_fn)(int, const uint8_t *, int64_t, int64_t, const float *, int64_t, float *, int);
typedef void (*rms_fn)(const float *, const float *, float *, int64_t, int64_t, float);
typedef void (*add_rms_fn)(float *, const float *, const float *, float *, int64_t, int64_t, float);
typedef int (*rope_fn)(float *, int64_t, int64_t, int64_t, int64_t, const float *, const float *, int64_t,
                       const int64_t *);
typedef void (*silu_fn)(const float *, float *, int64_t, int64_t);
typedef int (*attn_fn)(const float *, const float *, const float *, int64_t, int64_t, int64_t, int64_t,
                       const int64_t *, const int64_t *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                       float *, int);

typedef struct {  /* a block weight: its parts' layouts, blocks and row counts; n rows, k inputs */
    int nparts;
    const int *layouts;
    const uint8_t *const *blocks;
    const int64_t *rows;
    int64_t n, k;
} Product;

typedef struct {
    const float *input_norm, *post_norm, *qkv_bias, *q_norm, *k_norm;  /* the last three may be NULL */
    Product qkv, o, gate_up, down;
} Layer;

typedef struct {
    qparts_fn qparts;  /* kernels.cquant's (or kernels.cq8's) product of stacked parts, or NULL: then qone, one part */
    qone_fn qone;
    rms_fn rms;
    add_rms_fn add_rms;
    rope_fn rope;
    silu_fn silu;
    attn_fn attn;
    int64_t n_layers, d, H, KVH, D, F;
    float eps, scale;
    const Layer *layers;
    const float *final_norm;
} Model;

static int product(const Model *m, const Product *p, const float *x, int64_t R, float *out, int threads) {
    if (m->qparts) return m->qparts(p->nparts, p->layouts, p->blocks, p->rows, p->k, x, R, out, threads);
    if (p->nparts != 1) return 1;
    return m->qone(p->layouts[0], p->blocks[0], p->rows[0], p->k, x, R, out, threads);
}

/* The layers of one decode pass of R rows. x [R, d]: the embedded tokens, the residual stream
   (updated in place, as the per-op path does); h [R, d]: out, the final norm of the last
   layer's output. Row r is at position rope_pos[r] and writes its key and value at row
   kv_pos[r] of sequence seq[r] of the cache: layer l, sequence s, row j at
   kbase + l * layer_stride + s * seq_stride + j * row_stride (vbase likewise), [KVH, D]
   contiguous. Returns 0, or nonzero when a kernel refused (bad sizes, a position out of range).

   Threads: one OpenMP parallel region for the whole pass (not one per product: at one row a
   region's fork and join cost about what its work does). Its team calls each product and the
   attention together, and they share the output groups and the (query, head) pairs among
   themselves (kernels.cquant, kernels.cattention: called inside a team, each thread takes its
   share and returns), the row-local steps between them are shared by row, and barrier_wait
   ends each stage. Each output element is computed by the same code on the same inputs whichever thread
   runs it, so the bits do not depend on the thread count. */
int tttr_decode(const Model *m, float *x, float *h, int64_t R, const int64_t *rope_pos, const int64_t *kv_pos,
                const int64_t *seq, float *kbase, float *vbase, int64_t layer_stride, int64_t seq_stride,
                int64_t row_stride, int64_t n_seq, int64_t n_keys, const float *cos_t, const float *sin_t,
                int64_t n_pos, int threads) {
    const int64_t d = m->d, H = m->H, KVH = m->KVH, D = m->D, F = m->F, nqk = H + KVH, wq = (nqk + KVH) * D;
    for (int64_t r = 0; r < R; r++)
        if (seq[r] < 0 || seq[r] >= n_seq || kv_pos[r] < 0 || kv_pos[r] >= n_keys) return 3;
    for (int64_t r = 0; r < R; r++)
        if (rope_pos[r] < 0 || rope_pos[r] >= n_pos) return 5;
    float *buf = malloc(sizeof(float) * R * (wq + 2 * H * D + 2 * d + 3 * F));
    if (!buf) return 4;
    float *qkv = buf, *q = qkv + R * wq, *att = q + R * H * D, *o = att + R * H * D, *gu = o + R * d,
          *s = gu + R * 2 * F;
    int st = 0, fail = 0;
    Barrier bar = {0, 0, 0};
    /* A stage's kernel may fail in one thread only (cq8's activations, allocated per thread):
       its status is shared before the stage's barrier and read by all after it, so every
       thread leaves at the same point, none left waiting at the next barrier. */
#define STAGE(call) do { const int e_ = (call); if (e_) __atomic_store_n(&fail, e_, __ATOMIC_RELAXED); \
                         barrier_wait(&bar, n); if ((my = __atomic_load_n(&fail, __ATOMIC_RELAXED))) goto left; } while (0)
    #pragma omp parallel num_threads(threads > 0 ? threads : 1) if (threads > 1)
    {
        const int n = omp_get_num_threads();
        int my = 0;
        #pragma omp for schedule(static) nowait
        for (int64_t r = 0; r < R; r++) m->rms(x + r * d, m->layers[0].input_norm, h + r * d, 1, d, m->eps);
        barrier_wait(&bar, n);
        for (int64_t li = 0; li < m->n_layers; li++) {
            const Layer *L = m->layers + li;
            STAGE(product(m, &L->qkv, h, R, qkv, threads));
            float *kl = kbase + li * layer_stride, *vl = vbase + li * layer_stride;
            #pragma omp for schedule(static) nowait
            for (int64_t r = 0; r < R; r++) {
                float *row = qkv + r * wq;
                if (L->qkv_bias)
                    for (int64_t i = 0; i < wq; i++) row[i] = row[i] + L->qkv_bias[i];
                if (L->q_norm) {  /* Qwen3: each query and key head normalized (in place) before the rotary */
                    m->rms(row, L->q_norm, row, H, D, m->eps);
                    m->rms(row + H * D, L->k_norm, row + H * D, KVH, D, m->eps);
                }
                m->rope(row, 1, wq, nqk, D, cos_t, sin_t, n_pos, rope_pos + r);  /* positions checked above */
                const int64_t at = seq[r] * seq_stride + kv_pos[r] * row_stride;
                memcpy(q + r * H * D, row, sizeof(float) * H * D);
                memcpy(kl + at, row + H * D, sizeof(float) * KVH * D);
                memcpy(vl + at, row + nqk * D, sizeof(float) * KVH * D);
            }
            barrier_wait(&bar, n);
            STAGE(m->attn(q, kl, vl, seq_stride, row_stride, seq_stride, row_stride, seq, kv_pos, R, n_seq,
                          n_keys, H, KVH, D, m->scale, att, threads) ? 6 : 0);
            STAGE(product(m, &L->o, att, R, o, threads));
            #pragma omp for schedule(static) nowait
            for (int64_t r = 0; r < R; r++) m->add_rms(x + r * d, o + r * d, L->post_norm, h + r * d, 1, d, m->eps);
            barrier_wait(&bar, n);
            STAGE(product(m, &L->gate_up, h, R, gu, threads));
            #pragma omp for schedule(static) nowait
            for (int64_t r = 0; r < R; r++) m->silu(gu + r * 2 * F, s + r * F, 1, F);
            barrier_wait(&bar, n);
            STAGE(product(m, &L->down, s, R, o, threads));
            const float *next = li + 1 < m->n_layers ? L[1].input_norm : m->final_norm;
            #pragma omp for schedule(static) nowait
            for (int64_t r = 0; r < R; r++) m->add_rms(x + r * d, o + r * d, next, h + r * d, 1, d, m->eps);
            barrier_wait(&bar, n);
        }
    left:
        if (omp_get_thread_num() == 0) st = my;
    }
#undef STAGE
    free(buf);
    return st;
}
"""

_FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-fast-math", "-fno-trapping-math", "-ffp-contract=off", "-shared", "-fPIC"]

_p, _i64 = ctypes.c_void_p, ctypes.c_int64


class _Product(ctypes.Structure):
    _fields_ = [("nparts", ctypes.c_int), ("layouts", _p), ("blocks", _p), ("rows", _p), ("n", _i64), ("k", _i64)]


class _Layer(ctypes.Structure):
    _fields_ = [("input_norm", _p), ("post_norm", _p), ("qkv_bias", _p), ("q_norm", _p), ("k_norm", _p),
                ("qkv", _Product), ("o", _Product), ("gate_up", _Product), ("down", _Product)]


class _Model(ctypes.Structure):
    _fields_ = [("qparts", _p), ("qone", _p), ("rms", _p), ("add_rms", _p), ("rope", _p), ("silu", _p), ("attn", _p),
                ("n_layers", _i64), ("d", _i64), ("H", _i64), ("KVH", _i64), ("D", _i64), ("F", _i64),
                ("eps", ctypes.c_float), ("scale", ctypes.c_float), ("layers", _p), ("final_norm", _p)]


def _declare(lib) -> None:
    p, i = _p, _i64
    lib.tttr_decode.argtypes = [p, p, p, i, p, p, p, p, p, i, i, i, i, i, p, p, i, ctypes.c_int]
    lib.tttr_decode.restype = ctypes.c_int


_library = CLibrary("decode", SOURCE, _FLAGS, "the compiled decode step", _declare)


def available() -> bool:
    return _library.available() and crow.available() and cquant.available() and cattention.available()


# the layer fields the compiled step runs; any other a model's layers hold must be None
_LAYER_FIELDS = {"input_norm", "qkv", "qkv_bias", "q_norm", "k_norm", "o", "post_attention_norm", "gate_up", "down"}
_PRODUCTS = ("qkv", "o", "gate_up", "down")


def _fn(lib, name: str) -> int | None:
    f = getattr(lib, name, None)
    return None if f is None else ctypes.cast(f, ctypes.c_void_p).value


class _Plan:
    """The model as the compiled step reads it, made once per model and product kind: the
    structures and every array they point into (kept alive here). `q8`: the products are
    kernels.cq8's (8-bit activations, `invariant-q8`), each part's layout code carrying its
    activation kind; else kernels.cquant's."""

    def __init__(self, model, q8: bool = False) -> None:
        cfg = model.config
        keep = self._keep = []

        def arr(ctype, values):
            a = (ctype * len(values))(*values)
            keep.append(a)
            return ctypes.addressof(a)

        def product(qw) -> _Product:
            parts = getattr(qw, "parts", None)
            if parts is None:  # one part (kernels.cquant before stacked parts)
                layouts, blocks, rows = [cquant.FORMATS.index(qw.fmt)], [qw.data.ctypes.data], [qw.shape[0]]
            else:
                layouts = cq8.formats(qw) if q8 else [p.layout for p in parts]
                blocks, rows = [p.data.ctypes.data for p in parts], [p.n for p in parts]
            keep.append(qw)
            return _Product(len(layouts), arr(ctypes.c_int, layouts), arr(ctypes.c_void_p, blocks),
                            arr(ctypes.c_int64, rows), qw.shape[0], qw.shape[1])

        def tensor(t):
            if t is None:
                return None
            keep.append(t)
            return t.data_ptr() if hasattr(t, "data_ptr") else t.ctypes.data  # a tensor, or a numpy array

        layers = (_Layer * len(model.layers))()
        for dst, w in zip(layers, model.layers):
            dst.input_norm, dst.post_norm = tensor(w.input_norm), tensor(w.post_attention_norm)
            dst.qkv_bias = tensor(w.qkv_bias)
            dst.q_norm, dst.k_norm = tensor(getattr(w, "q_norm", None)), tensor(getattr(w, "k_norm", None))
            dst.qkv, dst.o, dst.gate_up, dst.down = product(w.qkv), product(w.o), product(w.gate_up), product(w.down)
        keep.append(layers)
        ql, rl, al = cquant.load(), crow.load(), cattention.load()
        qparts, qone = ((_fn(cq8.load(), "tttr_q8_linear_parts"), None) if q8
                        else (_fn(ql, "tttr_qlinear_parts"), _fn(ql, "tttr_qlinear")))
        self.model = _Model(
            qparts, qone, _fn(rl, "tttr_rms_norm"),
            _fn(rl, "tttr_add_rms_norm"), _fn(rl, "tttr_rope"), _fn(rl, "tttr_silu_mul"), _fn(al, "tttr_attention"),
            cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, model.layers[0].down.shape[1],
            cfg.rms_eps, model.scale, ctypes.addressof(layers), tensor(model.norm))


def q8_applies(layers) -> bool:
    """Whether kernels.cq8 is built and takes every product of `layers` (block weights): then
    the `invariant-q8` plan multiplies with 8-bit activations, as that mode's ops do one by one."""
    return cq8.available() and all(getattr(getattr(w, f), "parts", None) is not None and cq8.supports(getattr(w, f))
                                   for w in layers for f in _PRODUCTS)


# model -> ((its layers list, its final norm) when the plans were made, {q8: the plan or None})
_plans: "weakref.WeakKeyDictionary[object, tuple[tuple, dict[bool, _Plan | None]]]" = weakref.WeakKeyDictionary()


def _plan(model, q8: bool = False) -> _Plan | None:
    """The model's plan (`q8`: with kernels.cq8's products), or None when the compiled step
    cannot run it (decided once per model and kind, again if its layers or final norm are
    replaced)."""
    made = _plans.get(model)
    if made is None or made[0][0] is not model.layers or made[0][1] is not model.norm:
        made = _plans[model] = ((model.layers, model.norm), {})
    if q8 not in made[1]:
        made[1][q8] = _make_plan(model, q8)
    return made[1][q8]


def _make_plan(model, q8: bool) -> _Plan | None:
    import torch

    plan = None
    layers = model.layers
    if model.dtype == torch.float32 and model.device.type == "cpu" and available() and layers \
            and all((getattr(w, "q_norm", None) is None) == (getattr(w, "k_norm", None) is None) for w in layers) \
            and all(getattr(w, f) is None for w in layers for f in w._fields if f not in _LAYER_FIELDS) \
            and all(getattr(w, f).__class__ is cquant.QuantWeight for w in layers for f in _PRODUCTS) \
            and all(t.dtype == torch.float32 and t.is_contiguous() for w in layers
                    for t in (w.input_norm, w.post_attention_norm, w.qkv_bias, getattr(w, "q_norm", None),
                              getattr(w, "k_norm", None)) if t is not None) \
            and model.norm.dtype == torch.float32 and model.norm.is_contiguous() \
            and (_fn(cquant.load(), "tttr_qlinear_parts") is not None
                 or all(len(getattr(getattr(w, f), "parts", (0,))) == 1 for w in layers for f in _PRODUCTS)) \
            and (not q8 or q8_applies(layers)):
        plan = _Plan(model, q8)
    return plan


def _kv(t: torch.Tensor) -> bool:
    """fp32 with contiguous [KVH, D] rows, as the attention kernel reads them in place."""
    import torch

    return t is not None and t.dtype == torch.float32 and t.stride(-1) == 1 and t.stride(-2) == t.shape[-1]


def decode(model, x: torch.Tensor, positions: torch.Tensor, segments, q8: bool = False) -> torch.Tensor | None:
    """The layers of a pass whose rows each decode one token, compiled: x [R, d] is the
    embedded tokens (a fresh tensor: the residual stream is updated in it); returns the final
    norm's output [R, d] (what the head multiplies), the per-op path's bits (`q8`: those of
    `invariant-q8`, kernels.cq8's products). None when this pass or model is not one the
    compiled step runs (see the module docstring): the caller runs the ops one by one."""
    import torch

    R = x.shape[0]
    if not segments or len(segments) != R or any(s.end - s.start != 1 for s in segments) \
            or x.dtype != torch.float32 or not x.is_contiguous() or tuple(x.shape) != (R, model.config.d_model):
        return None
    plan = _plan(model, q8)
    if plan is None:
        return None
    caches = [s.cache for s in segments]
    pool = caches[0].pool
    if pool is not None and pool.k is not None and all(c.pool is pool for c in caches):
        k, v = pool.k, pool.v  # [layers, slots, capacity, KVH, D]
        seq, n_seq = [c.slot for c in caches], k.shape[1]
        layer_stride, seq_stride, row_stride, n_keys = k.stride(0), k.stride(1), k.stride(2), k.shape[2]
    elif len(caches) == 1 and pool is None:
        k, v = caches[0].k, caches[0].v  # [layers, capacity, KVH, D]
        seq, n_seq = [0], 1
        layer_stride, seq_stride, row_stride, n_keys = k.stride(0), 0, k.stride(1), k.shape[1]
    else:
        return None
    if not (_kv(k) and _kv(v) and k.stride() == v.stride() and k.shape == v.shape) \
            or any(c.length >= c.capacity for c in caches):
        return None
    order = [s.start for s in segments]
    kv_pos = torch.tensor([c.length for c in caches], dtype=torch.int64)
    seq_t = torch.tensor(seq, dtype=torch.int64)
    if order != list(range(R)):  # arrays are by row
        inv = torch.tensor(order, dtype=torch.int64).argsort()
        kv_pos, seq_t = kv_pos[inv].contiguous(), seq_t[inv].contiguous()
    rope_pos = positions.to(torch.int64).contiguous()
    cos, sin = model._cos, model._sin
    h = torch.empty_like(x)
    status = _library.load().tttr_decode(
        ctypes.addressof(plan.model), x.data_ptr(), h.data_ptr(), R, rope_pos.data_ptr(), kv_pos.data_ptr(),
        seq_t.data_ptr(), k.data_ptr(), v.data_ptr(), layer_stride, seq_stride, row_stride, n_seq, n_keys,
        cos.data_ptr(), sin.data_ptr(), cos.shape[0], torch.get_num_threads())
    if status:
        raise ValueError(f"compiled decode step failed (status {status}): a size or position out of range")
    return h
