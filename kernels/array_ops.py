"""The compiled kernels on numpy arrays, without torch: what the torch-free generation path
(engine/inference/lite.py) calls, as `ops` is what the model calls. The same C functions
`ops` reaches (kernels.cquant's block products, kernels.crow's row-local steps, kernels.cdecode's
whole decode pass) on the same values, so the same bits: only the arrays differ.

Nothing here imports torch; every function takes C-contiguous arrays (fp32, int64 where said)
and the thread count the kernels split their work over (any count gives the same bits)."""

from __future__ import annotations

import ctypes
import hashlib

import numpy as np

from tttr.kernels import REVISION, cattention, cdecode, cq8, cquant, crow
from tttr.kernels.kquants import LAYOUT_BYTES, PACK_SOURCE

QUANT_FORMATS = cquant.FORMATS  # the GGUF block formats the products take
QuantWeight = cquant.QuantWeight
# Names the packed layout: a block cache keyed by it is never read by another layout.
LAYOUT_KEY = hashlib.blake2b(f"{LAYOUT_BYTES}\0{PACK_SOURCE}".encode(), digest_size=12).hexdigest()


def available() -> bool:
    """Whether every kernel the torch-free path needs built here (products, row steps,
    attention, the decode pass)."""
    return cdecode.available()


def block_weights(parts) -> QuantWeight | None:
    """The block weight of parts [(GGUF type, raw rows)] stacked (see ops.block_weights), or None."""
    return cquant.block_weights(parts)


def weight_parts(qw: QuantWeight) -> list[tuple[str, np.ndarray]]:
    """A block weight's parts as (GGUF type, packed bytes [groups, blocks, layout bytes])."""
    return [(p.fmt, p.data) for p in qw.parts]


def weight_from_parts(parts: list[tuple[str, np.ndarray]]) -> QuantWeight:
    """The block weight `weight_parts` gave the parts of (the bytes used in place: a mapping)."""
    return cquant.stack([cquant.Part(fmt, data) for fmt, data in parts])


def embedding(qw: QuantWeight, ids) -> np.ndarray:
    """Rows `ids` of a block weight as fp32 [R, K] (ops.embedding's values)."""
    return np.ascontiguousarray(qw.rows_array(ids), dtype=np.float32)


def linear(x: np.ndarray, qw: QuantWeight, threads: int, q8: bool = False) -> np.ndarray:
    """x [M, K] @ the weight's [N, K] transposed -> [M, N] (ops.linear of a block weight; `q8`:
    as under `invariant-q8`, each row quantized to 8 bits first, kernels.cq8)."""
    return (cq8.linear_array if q8 else cquant.linear_array)(x, qw, threads)


def q8_applies(layers, head: QuantWeight) -> bool:
    """Whether kernels.cq8 is built and takes every product of a model's `layers` and its
    `head`: what the torch-free path needs to run `invariant-q8`."""
    return cdecode.q8_applies(layers) and cq8.supports(head)


def _rows(fn, x: np.ndarray, threads: int) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty_like(x)
    fn(x.ctypes.data, y.ctypes.data, x.shape[0], x.shape[1], threads)
    return y


def log_softmax(x: np.ndarray, threads: int) -> np.ndarray:
    """Each row of fp32 [n, m] (ops.log_softmax under `invariant`)."""
    return _rows(crow.load().tttr_log_softmax, x, threads)


def softmax(x: np.ndarray, threads: int) -> np.ndarray:
    """Each row of fp32 [n, m] (ops.softmax under `invariant`)."""
    return _rows(crow.load().tttr_softmax, x, threads)


def topk(x: np.ndarray, k: int, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """(values fp32 [n, k], indices int64 [n, k]) of each row's k largest (ops.topk)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, m = x.shape
    if not 0 < k <= min(m, crow.TOPK_MAX):
        raise ValueError(f"topk: k={k} must be in 1..{min(m, crow.TOPK_MAX)}")
    vals, idx = np.empty((n, k), np.float32), np.empty((n, k), np.int64)
    crow.load().tttr_topk(x.ctypes.data, n, m, k, vals.ctypes.data, idx.ctypes.data, threads)
    return vals, idx


def draw(probs: np.ndarray, u: np.ndarray, threads: int) -> list[int]:
    """Each row's inverse-CDF index of probs fp32 [n, m] at u float64 [n] (ops.draw)."""
    probs = np.ascontiguousarray(probs, dtype=np.float32)
    u = np.ascontiguousarray(u, dtype=np.float64)
    out = np.empty(probs.shape[0], np.int64)
    crow.load().tttr_draw(probs.ctypes.data, u.ctypes.data, probs.shape[0], probs.shape[1], out.ctypes.data, threads)
    return out.tolist()


def decode_plan(model, q8: bool = False):
    """kernels.cdecode's plan of a model whose layers are LayerWeights of numpy arrays and block
    weights (with `config`, `norm`, `scale`, as `Model` has them; `q8`: kernels.cq8's products,
    where `q8_applies`); kept by the caller."""
    return cdecode._Plan(model, q8)


def decode(plan, x: np.ndarray, positions: np.ndarray, k: np.ndarray, v: np.ndarray, cos: np.ndarray,
           sin: np.ndarray, threads: int) -> np.ndarray:
    """All layers for the rows x [R, d] (embedded tokens; the residual stream, updated in place)
    of ONE sequence at cache positions `positions` (int64 [R]), their keys and values written
    to k, v [layers, capacity, KVH, D] before attention reads each row's keys 0..its position:
    R consecutive positions are a causal prefill, one row a decode step. Returns the final
    norm's output [R, d] (what the head multiplies): ops' per-op bits (kernels.cdecode)."""
    R = x.shape[0]
    if not (x.dtype == k.dtype == v.dtype == np.float32 and positions.dtype == np.int64 and k.shape == v.shape
            and all(a.flags.c_contiguous for a in (x, positions, k, v, cos, sin)) and positions.shape == (R,)):
        raise ValueError("decode: contiguous fp32 rows and caches, int64 positions (one per row) expected")
    h = np.empty_like(x)
    seq = np.zeros(R, np.int64)
    status = cdecode._library.load().tttr_decode(
        ctypes.addressof(plan.model), x.ctypes.data, h.ctypes.data, R, positions.ctypes.data, positions.ctypes.data,
        seq.ctypes.data, k.ctypes.data, v.ctypes.data, k.strides[0] // 4, 0, k.strides[1] // 4, 1, k.shape[1],
        cos.ctypes.data, sin.ctypes.data, cos.shape[0], threads)
    if status:
        raise ValueError(f"compiled decode step failed (status {status}): a size or position out of range")
    return h


def describe() -> dict:
    """Which of TTTR's own kernels run here (each builds with the C compiler on first use),
    as the run fingerprint records them (kernels.ops.describe is this)."""
    return {
        # the CPU invariant attention: "compiled" or "blocked" (different bits, each invariant;
        # kernels.invariant.attention_kernel)
        "attention_kernel": "compiled" if cattention.available() else "blocked",
        # products by Q4_1/Q8_0/Q4_K/Q5_0/Q5_K/Q6_K weights of a GGUF file run from its blocks ("blocks:avx512",
        # ":avx2", ":c", the same bits from each), or all products are dense fp32 ("dense")
        "linear_kernel": f"blocks:{cquant.kernel_name()}" if cquant.available() else "dense",
        "row_kernels": "compiled" if crow.available() else "torch",
        # the `invariant-q8` mode's block products (8-bit activations: "q8:avx512", "q8:avx2" or "q8:c", the
        # same bits from each), or "none": that mode then multiplies as `invariant` does; which
        # mode a run used is its kernel_mode
        "q8_kernel": f"q8:{cq8.kernel_name()}" if cq8.available() else "none",
        "kernels_revision": REVISION,
    }
