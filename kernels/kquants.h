
/* fp16 -> fp32, exact (every half is a float) */
static float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
    if (e == 0) {
        float f = (float)m * 0x1p-24f; /* zero or subnormal: m * 2^-24, exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (e == 31) {
        bits = sign | 0x7f800000u | (m << 13);
    } else {
        bits = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Q4_K/Q5_K: 6-bit scale and minimum of sub-block j from the 12 packed bytes (llama.cpp's
   get_scale_min_k4) */
static void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* Inputs 32b .. 32b + 31 of a GGUF row of format F (the index in kquants.FORMATS): the quants
   the layout stores (q[j]) and its two fp32 values (A, B), as the module docstring says. */
static inline __attribute__((always_inline)) void decode(const int f, const uint8_t *row, int64_t b, int q[32],
                                                         float *A, float *B) {
    if (f == 0) { /* Q4_1: d, m, 16 bytes: byte j holds input j (low nibble) and j + 16 (high) */
        const uint8_t *blk = row + b * 20;
        *A = half_to_float(blk);
        *B = half_to_float(blk + 2);
        for (int j = 0; j < 32; j++) q[j] = j < 16 ? blk[4 + j] & 15 : blk[4 + j - 16] >> 4;
    } else if (f == 1) { /* Q8_0: d, 32 int8 */
        const uint8_t *blk = row + b * 34;
        *A = half_to_float(blk);
        *B = 0.0f;
        for (int j = 0; j < 32; j++) q[j] = (int8_t)blk[2 + j];
    } else if (f == 3) { /* Q5_0: d, 32 high bits (little-endian u32), 16 bytes of low nibbles as Q4_1 */
        const uint8_t *blk = row + b * 22;
        uint32_t qh;
        memcpy(&qh, blk + 2, 4);
        *A = half_to_float(blk);
        *B = 0.0f;
        for (int j = 0; j < 16; j++) {
            q[j] = ((blk[6 + j] & 15) | (int)(((qh >> j) & 1) << 4)) - 16;
            q[j + 16] = ((blk[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4)) - 16;
        }
    } else if (f == 2 || f == 4) { /* Q4_K, Q5_K: d, dmin, 12 scale bytes, (Q5_K: 32 high-bit bytes), 128 nibble bytes */
        const int bytes = f == 2 ? 144 : 176, s = (int)(b % 8);
        const uint8_t *sb = row + (b / 8) * bytes;
        int sc, m;
        scale_min_k4(s, sb + 4, &sc, &m);
        *A = half_to_float(sb) * (float)sc;
        *B = -(half_to_float(sb + 2) * (float)m);
        const uint8_t *qs = sb + (f == 2 ? 16 : 48) + 32 * (s / 2); /* sub-block s: nibble s % 2 of 32 bytes */
        for (int j = 0; j < 32; j++) {
            int v = (s & 1) ? qs[j] >> 4 : qs[j] & 15;
            if (f == 4) v |= ((sb[16 + j] >> s) & 1) << 4;
            q[j] = v;
        }
    } else { /* Q6_K: 128 low-nibble bytes, 64 high-pair bytes, 16 int8 scales, d */
        const uint8_t *sb = row + (b / 8) * 210, *ql = sb, *qh = sb + 128;
        /* element 32t + j of the super-block: in half h = t / 4 at r = 32u + j (u = t % 4), its low
           nibble in byte 64h + r % 64 (shifted 4 * (r / 64)), its high pair in byte 32h + j (2u) */
        const int t = (int)(b % 8), h = t / 4, u = t % 4, ls = 4 * (u / 2), hs = 2 * u;
        const uint8_t *l = ql + 64 * h + 32 * (u & 1), *hb = qh + 32 * h;
        const float d = half_to_float(sb + 208);
        *A = d * (float)(int8_t)sb[192 + 2 * t];
        *B = d * (float)(int8_t)sb[192 + 2 * t + 1];
        for (int j = 0; j < 32; j++) q[j] = (((l[j] >> ls) & 15) | (((hb[j] >> hs) & 3) << 4)) - 32;
    }
}

static const int layout_of[6] = {0, 1, 4, 1, 2, 5};
static const int64_t gguf_block[6][2] = {{32, 20}, {32, 34}, {256, 144}, {32, 22}, {256, 176}, {256, 210}};

/* Layouts 4 (Q4_K) and 5 (Q6_K) keep a super-block's scales apart, as the file does, per group
   of 16 rows and 256 inputs (SB_BYTES(L), 8 * BLOCK_BYTES(L)):
     4: d[16], -dmin[16] (fp32), sc[8][16], m[8][16] (u8, 6 bits), then sub-block s's quants as
        layout 0's (byte p * 16 + lane: input 2p low nibble, 2p + 1 high): A = d * sc, B = -dmin * m
     5: d[16] (fp32), sc[16][16] (int8, one per 16 inputs), then per sub-block s: 256 bytes of
        low nibbles as layout 0's and 128 bytes of high pairs (byte c * 16 + lane: input 4c + i in
        bits 2i, 2i + 1), q the stored 6 bits: A, B = d * sc[2s], d * sc[2s + 1], w = A|B * (q - 32)
   The products compute A and B in registers: each is exact (a 17-bit product), the value layouts
   0 and 3 stored, so the weights and the bits are the same. */
static void pack_ksuper(const int f, const uint8_t *raw, int64_t N, int64_t nb, int64_t row_bytes, uint8_t *out) {
    const int L = layout_of[f];
    const int64_t sbb = 8 * BLOCK_BYTES(L), nsb = nb / 8, groups = N / G;
    int q[32];
    float A, B;
    for (int64_t g = 0; g < groups; g++)
        for (int64_t t = 0; t < nsb; t++) {
            uint8_t *o = out + (g * nsb + t) * sbb;
            for (int lane = 0; lane < G; lane++) {
                const uint8_t *row = raw + (g * G + lane) * row_bytes;
                if (L == 4) {
                    const uint8_t *sb = row + t * 144;
                    const float d = half_to_float(sb), nm = -half_to_float(sb + 2);
                    memcpy(o + 4 * lane, &d, 4);
                    memcpy(o + 4 * G + 4 * lane, &nm, 4);
                    for (int s = 0; s < 8; s++) {
                        int sc, m;
                        scale_min_k4(s, sb + 4, &sc, &m);
                        o[8 * G + s * G + lane] = (uint8_t)sc;
                        o[16 * G + s * G + lane] = (uint8_t)m;
                        decode(f, row, t * 8 + s, q, &A, &B);
                        uint8_t *qs = o + 24 * G + s * 16 * G;
                        for (int p = 0; p < 16; p++) qs[p * G + lane] = (uint8_t)(q[2 * p] | (q[2 * p + 1] << 4));
                    }
                } else {
                    const uint8_t *sb = row + t * 210;
                    const float d = half_to_float(sb + 208);
                    memcpy(o + 4 * lane, &d, 4);
                    for (int u = 0; u < 16; u++) o[4 * G + u * G + lane] = sb[192 + u];
                    for (int s = 0; s < 8; s++) {
                        decode(f, row, t * 8 + s, q, &A, &B);
                        uint8_t *ql = o + 20 * G + s * 24 * G, *qh = ql + 16 * G;
                        for (int j = 0; j < 32; j++) q[j] += 32;
                        for (int p = 0; p < 16; p++) ql[p * G + lane] = (uint8_t)((q[2 * p] & 15) | ((q[2 * p + 1] & 15) << 4));
                        for (int c = 0; c < 8; c++) {
                            int h = 0;
                            for (int i = 0; i < 4; i++) h |= (q[4 * c + i] >> 4) << (2 * i);
                            qh[c * G + lane] = (uint8_t)h;
                        }
                    }
                }
            }
        }
}

static inline __attribute__((always_inline)) void pack_format(const int f, const uint8_t *raw, int64_t N, int64_t nb,
                                                              int64_t row_bytes, uint8_t *out) {
    const int layout = layout_of[f];
    if (layout >= 4) {
        pack_ksuper(f, raw, N, nb, row_bytes, out);
        return;
    }
    const int64_t gb = BLOCK_BYTES(layout), groups = N / G;
    const int qoff = (layout == 1 ? 1 : 2) * G * 4;
    int q[32];
    float A, B;
    for (int64_t g = 0; g < groups; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + (g * nb + b) * gb;
            for (int lane = 0; lane < G; lane++) {
                decode(f, raw + (g * G + lane) * row_bytes, b, q, &A, &B);
                memcpy(o + 4 * lane, &A, 4);
                if (layout != 1) memcpy(o + 4 * G + 4 * lane, &B, 4);
                if (layout == 0)
                    for (int p = 0; p < 16; p++) o[qoff + p * G + lane] = (uint8_t)(q[2 * p] | (q[2 * p + 1] << 4));
                else
                    for (int j = 0; j < 32; j++) o[qoff + j * G + lane] = (uint8_t)(int8_t)q[j];
            }
        }
}

/* The layout of kquants.FORMATS[f]'s layout from N GGUF rows of K inputs, row r at
   raw + r * row_bytes: per group of 16 rows and 32-input block, A (and B) of the 16 rows as
   fp32, then the quants input by input, one byte per row (layout 0: inputs 2p and 2p + 1 in
   one byte, low nibble first). One thread: bound by memory, and a parallel region per weight
   at load cost more than it gained (measured 0.46 vs 0.17 s for the default model on 2 busy
   cores). Returns nonzero on bad sizes. */
int tttr_qpack(int f, const uint8_t *raw, int64_t N, int64_t K, int64_t row_bytes, uint8_t *out) {
    if (f < 0 || f > 5 || N % G || K % gguf_block[f][0]) return 1;
    const int64_t nb = K / 32;
    if (row_bytes < K / gguf_block[f][0] * gguf_block[f][1]) return 1;
    switch (f) { /* each with its format a constant */
        case 0: pack_format(0, raw, N, nb, row_bytes, out); break;
        case 1: pack_format(1, raw, N, nb, row_bytes, out); break;
        case 2: pack_format(2, raw, N, nb, row_bytes, out); break;
        case 3: pack_format(3, raw, N, nb, row_bytes, out); break;
        case 4: pack_format(4, raw, N, nb, row_bytes, out); break;
        default: pack_format(5, raw, N, nb, row_bytes, out); break;
    }
    return 0;
}
