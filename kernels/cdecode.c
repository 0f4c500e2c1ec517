
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
