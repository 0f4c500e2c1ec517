/* The machine's limits, measured by the bench beside the engine's figures (kernels/machine.py).

   tttr_stream_read: a streaming read of n floats, each of `threads` threads summing one
   contiguous part with 4 independent vector accumulators (loads, not arithmetic, are the
   bound); the sum is returned so the compiler cannot drop the reads.

   tttr_fma_peak: `iters` rounds of CHAINS independent vector fused multiply-adds per thread
   (enough chains to cover the FMA units' latency times their number), the widest vectors the
   build targets; returns a value computed from every chain for the same reason. Flops per
   call: threads * iters * CHAINS * LANES * 2. */
#include <stdint.h>
#include <omp.h>

#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
#define CHAINS 12

typedef float vec __attribute__((vector_size(LANES * 4)));
typedef float v8 __attribute__((vector_size(32), aligned(4)));

int tttr_fma_lanes(void) { return LANES; }
int tttr_fma_chains(void) { return CHAINS; }

double tttr_stream_read(const float *buf, int64_t n, int threads) {
    double total = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t lo = (n * t / nt) & ~(int64_t)31, hi = t == nt - 1 ? n : (n * (t + 1) / nt) & ~(int64_t)31;
        v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        int64_t i = lo;
        for (; i + 32 <= hi; i += 32) {
            a0 += *(const v8 *)(buf + i);
            a1 += *(const v8 *)(buf + i + 8);
            a2 += *(const v8 *)(buf + i + 16);
            a3 += *(const v8 *)(buf + i + 24);
        }
        v8 s = (a0 + a1) + (a2 + a3);
        double part = 0.0;
        for (int l = 0; l < 8; l++) part += s[l];
        for (; i < hi; i++) part += buf[i];
        total += part;
    }
    return total;
}

double tttr_fma_peak(int64_t iters, int threads, float seed) {
    double total = 0.0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        vec acc[CHAINS];
        vec b, c;
        for (int l = 0; l < LANES; l++) {
            b[l] = 0.999999f;
            c[l] = seed * 1e-7f;
        }
        for (int j = 0; j < CHAINS; j++)
            for (int l = 0; l < LANES; l++) acc[j][l] = seed + (float)(j + l);
        for (int64_t it = 0; it < iters; it++) {
#pragma GCC unroll 12
            for (int j = 0; j < CHAINS; j++) acc[j] = acc[j] * b + c;
        }
        double part = 0.0;
        for (int j = 0; j < CHAINS; j++)
            for (int l = 0; l < LANES; l++) part += acc[j][l];
        total += part;
    }
    return total;
}
