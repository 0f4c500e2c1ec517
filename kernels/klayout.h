
/* The packed layouts' addressing, shared by kernels.cquant and kernels.cq8 (G, the group's 16
   rows, defined first): bytes per group and 32-input block, where a block's quants lie, and
   where its A and B come from (kquants.py, kquants.h). */
#define NLAYOUTS 6
/* bytes per group and 32-input block (layouts 4, 5: an eighth of a 256-input super-block's) */
#define BLOCK_BYTES(FMT) ((FMT) == 0 ? 24 * G : (FMT) == 1 ? 36 * G : (FMT) == 4 ? 19 * G : (FMT) == 5 ? 424 : 40 * G)
#define QOFF(FMT) ((FMT) == 1 ? G * 4 : 2 * G * 4)
/* Block b of a group at gw: its quants qs (layout 5: low nibbles; qh the high pairs) and where
   its A and B come from (kquants.h): layouts 0-3 store them at blk (A, then B); 4 makes
   A = d * sa, B = dm * sb_ (dm: -dmin) and 5 A = d * sa, B = d * sb_, per lane, from the
   super-block's fp32 d and 8-bit scales (unsigned for 4, signed for 5). */
typedef struct { const uint8_t *blk, *qs, *qh, *sa, *sb_; const float *d, *dm; } Block;
static inline __attribute__((always_inline)) Block block_at(const int fmt, const uint8_t *gw, int64_t b) {
    Block k;
    if (fmt < 4) {
        k.blk = gw + b * BLOCK_BYTES(fmt);
        k.qs = k.blk + QOFF(fmt);
        k.qh = k.sa = k.sb_ = 0;
        k.d = k.dm = 0;
        return k;
    }
    const uint8_t *sb = gw + (b >> 3) * 8 * BLOCK_BYTES(fmt);
    const int s = (int)(b & 7);
    k.blk = sb;
    k.d = (const float *)sb;
    if (fmt == 4) {
        k.dm = (const float *)sb + G;
        k.sa = sb + 8 * G + s * G;
        k.sb_ = sb + 16 * G + s * G;
        k.qs = sb + 24 * G + s * 16 * G;
        k.qh = 0;
    } else {
        k.dm = k.d;
        k.sa = sb + 4 * G + 2 * s * G;
        k.sb_ = k.sa + G;
        k.qs = sb + 20 * G + s * 24 * G;
        k.qh = k.qs + 16 * G;
    }
    return k;
}

/* Each block asks for the bytes PREFETCH_BYTES ahead of it (the group's next blocks, then the
   next group's: a thread's groups are consecutive), so more lines are in flight than the core's
   own prefetcher keeps while the expansion runs. Measured by CPU time on a loaded machine, a pass
   over every product: kernels.cquant's layouts 4 and 5 (llama-1b) at 0.69x of the old layouts
   without it, ~1.0x with it at 1 row; the default model's Q4_1/Q8_0 1.02x at 1 row, 1.5x at 8,
   1.12x at 64; kernels.cq8's: llama-1b 1.3x at 1 and 8 rows, the default model 1.06x and 1.2x.
   Timing only: no value changes. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 4096
#endif
#if PREFETCH_BYTES > 0
#define PREFETCH(FMT, GW, B) do { const char *p_ = (const char *)(GW) + (B) * BLOCK_BYTES(FMT) + PREFETCH_BYTES; \
        for (int o_ = 0; o_ < BLOCK_BYTES(FMT); o_ += 64) __builtin_prefetch(p_ + o_, 0, 3); } while (0)
#else
#define PREFETCH(FMT, GW, B) do { } while (0)
#endif
