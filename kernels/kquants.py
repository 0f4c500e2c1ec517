"""GGUF block formats repacked into the layouts kernels.cquant's products read: which formats,
which layout each takes, and the compiled packer (C source that cquant builds with its own).

Every format's weight is expanded by the products to exactly the fp32 value
`gguf.quants.dequantize` gives. Each layout holds, per group of 16 output rows and 32-input
block, two fp32 vectors of 16 (A, B) and the 32 x 16 quants input by input, and expands a
weight as follows (q the stored quant, k the input's place in its block):

    layout 0 ("Q4_1", 4-bit q, two to a byte): w = fma(A, q, B)
    layout 1 ("Q8_0", int8 q, A only):          w = A * q
    layout 2 ("Q8 with minimum", int8 q):       w = fma(A, q, B)
    layout 3 ("Q8, two scales", int8 q):        w = (k < 16 ? A : B) * q
    layout 4 ("Q4_K"): layout 0 with A = d*sc, B = -dmin*m made in registers from the
        super-block's d, -dmin (fp32) and 6-bit sc, m (a byte each), kept apart as the file keeps them
    layout 5 ("Q6_K"): layout 3 with A, B = d*sc of the block's two 16-input sub-blocks made in
        registers (int8 sc), q - 32 from the stored 6 bits (a low nibble and a high pair)

How each format lands, and why the value is gguf's (fp16 d, dmin as fp32 are exact; each
product named exact has at most 24 significant bits):

    Q4_1  w = d*q + m            layout 0: A = d, B = m (d*q exact, one rounding, as fma)
    Q8_0  w = d*q                layout 1: A = d
    Q5_0  w = d*(q - 16)         layout 1: A = d, q - 16 as int8 (exact)
    Q4_K  w = (d*sc)*q - dmin*m  layout 4: A = d*sc (6-bit sc: exact), B = (-dmin)*m (exact, the
                                 value -(dmin*m) is); (d*sc)*q is exact, so fma(A, q, B) rounds
                                 once, as gguf's subtraction does; 8 sub-blocks of 32 a 256-input
                                 super-block
    Q5_K  the same, 5-bit q      layout 2: A = d*sc, B = -(dmin*m)
    Q6_K  w = (d*sc)*(q - 32)    layout 5: A, B = d*sc of the block's two 16-input sub-blocks
                                 (int8 sc: exact), q - 32; the product is exact

Layouts 4 and 5 (issue 33) read 4.75 and 6.6 bits a weight where layouts 0 and 3 read 6 and 10
(the file: 4.5 and 6.56): A and B are the same exact products, made per block in registers
instead of stored, so the weights, the sums and the bits are the same.

Repacking is one pass over the file's bytes (`tttr_qpack`), once per weight at load."""

from __future__ import annotations

from pathlib import Path

from tttr.sessions.cache import c_source

GROUP = 16  # output rows per group (one AVX-512 vector)
BLOCK = 32  # inputs per layout block

# GGUF type -> (layout, inputs per GGUF block, bytes per GGUF block); the index is the packer's id
FORMATS = {
    "Q4_1": (0, 32, 20),
    "Q8_0": (1, 32, 34),
    "Q4_K": (4, 256, 144),
    "Q5_0": (1, 32, 22),
    "Q5_K": (2, 256, 176),
    "Q6_K": (5, 256, 210),
}
# bytes per (group, 32-input block) of each layout: A (and B) as fp32, then the quants (layouts
# 4, 5: an eighth of a (group, 256-input super-block)'s bytes, whose layout kquants.h gives)
LAYOUT_BYTES = (2 * GROUP * 4 + 16 * GROUP, GROUP * 4 + 32 * GROUP, 2 * GROUP * 4 + 32 * GROUP,
                2 * GROUP * 4 + 32 * GROUP, 19 * GROUP, 424)
LAYOUT_NAMES = ("Q4_1", "Q8_0", "Q8 with minimum", "Q8, two scales", "Q4_K", "Q6_K")
SUPER_LAYOUTS = (4, 5)  # laid out per 256-input super-block

# the packer, `tttr_qpack`: C that kernels.cquant builds with its own (cquant.c includes it)
PACK_SOURCE = c_source(Path(__file__).with_name("kquants.h"))
