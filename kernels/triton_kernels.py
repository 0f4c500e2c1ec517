"""Batch-invariant Triton kernels for the GPU (and the Triton interpreter on CPU).

What keeps a row's bits independent of the batch:
- matmul: persistent (one program per SM walks the output tiles), one fixed tile
  configuration per dtype, the whole K loop inside one program (no split-K), so the
  reduction order of an output element is fixed by K and the tile constants alone.
  No autotuning: an autotuner picks configurations by shape and brings the variance back.
- RMSNorm, softmax and log-softmax: one program per row, walking the row in fixed-size
  blocks; nothing is shared between rows.
- attention: each query is reduced over keys 0..pos in splits of a fixed number of keys
  (`KV_SPLIT`), not a fixed number of splits, and the splits are combined in order, so a
  query's result depends on its position, never on how many queries or keys the call
  holds: one prefill, chunks and token-by-token decode give the same bits.
  `decode_attention` writes the new K/V into the cache before attention reads it.

`M` (rows) and `T` (queries) are not specialised on (`do_not_specialize`), so a 1-row call
runs the same compiled kernel as a 256-row one. Under TRITON_INTERPRET=1 (set before
triton is imported) the kernels run on CPU tensors; bf16 is not supported there. The
interpreter runs `tl.dot` as numpy's matmul of the tile, whose rows need not get the same
bits at every place in the tile (numpy's OpenBLAS on an AMD EPYC does not: rows differ
with their place in a period of 6 and at the tile's end); a probe checks that once per
tile shape, and where it varies the interpreter takes an exact fixed-order product in
place of `tl.dot` (`_interpreter_exact_dot`). Compiled for a GPU, the kernel is unchanged
(the branch is on a constexpr, so its code is not generated).
"""

from __future__ import annotations

import os

import numpy as np
import torch
import triton
import triton.language as tl

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) per dtype. Fixed: never chosen by shape.
MATMUL_TILES = {
    torch.float32: (32, 64, 32, 4, 3),
    torch.bfloat16: (64, 128, 64, 4, 3),
    torch.float16: (64, 128, 64, 4, 3),
}
ROW_BLOCK = 1024  # elements per step of the row kernels
KV_BLOCK = 32  # keys per inner step of attention
KV_SPLIT = 256  # keys per split of attention (a multiple of KV_BLOCK)
INTERPRETER_PROGRAMS = 4  # persistent programs when there is no GPU to count SMs on

_num_sms: dict[int, int] = {}


def _programs(device: torch.device) -> int:
    if device.type != "cuda":
        return INTERPRETER_PROGRAMS
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _num_sms:
        _num_sms[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _num_sms[idx]


# ------------------------------------------------------------------------------ matmul


@triton.jit(do_not_specialize=["M"])
def _matmul_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                   stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                   HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, EXACT_DOT: tl.constexpr, NUM_PROGS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    for tile in range(pid, tiles, NUM_PROGS):
        offs_m = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk,
                        mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
            b = tl.load(w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None] * stride_wk,
                        mask=(offs_n[None, :] < N) & (offs_k[:, None] < K), other=0.0)
            if EXACT_DOT:  # the interpreter, where numpy's matmul varies by row (see the docstring)
                acc += tl.sum(a[:, :, None].to(tl.float32) * b[None, :, :].to(tl.float32), axis=1)
            elif IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn,
                 acc.to(y_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


_exact_dot: dict[tuple[int, int, int], bool] = {}


def _interpreter_exact_dot(bm: int, bn: int, bk: int) -> bool:
    """Whether the interpreter must replace `tl.dot` for [bm, bk] x [bk, bn] fp32 tiles: True
    where numpy's matmul gives a row other bits at another place in the tile (decided once
    by a probe that moves every row through every place). Always False on a GPU."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return False
    key = (bm, bn, bk)
    if key not in _exact_dot:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((bm, bk)).astype(np.float32)
        b = rng.standard_normal((bk, bn)).astype(np.float32)
        acc = rng.standard_normal((bm, bn)).astype(np.float32)
        full = np.matmul(a, b, dtype=np.float32) + acc

        def moved(s: int) -> np.ndarray:  # every row s places further down the tile, and back
            return np.roll(np.matmul(np.roll(a, s, 0), b, dtype=np.float32) + np.roll(acc, s, 0), -s, 0)

        _exact_dot[key] = not all(np.array_equal(moved(s), full) for s in range(1, bm))
    return _exact_dot[key]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T (+ bias) -> [..., N], in x's dtype, fp32 accumulation."""
    k = x.shape[-1]
    n = weight.shape[0]
    if weight.shape[1] != k:
        raise ValueError(f"linear: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}")
    if x.dtype not in MATMUL_TILES:
        raise ValueError(f"linear: dtype {x.dtype} has no tile configuration: use one of {list(MATMUL_TILES)}")
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y.reshape(*x.shape[:-1], n)
    weight = weight.to(x.dtype)
    bm, bn, bk, warps, stages = MATMUL_TILES[x.dtype]
    progs = _programs(x.device)
    grid = (min(progs, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)
    _matmul_kernel[grid](
        x2, weight, bias if bias is not None else y, y, m, n, k,
        x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1), y.stride(0), y.stride(1),
        HAS_BIAS=bias is not None, IEEE=x.dtype == torch.float32,
        EXACT_DOT=x.device.type != "cuda" and _interpreter_exact_dot(bm, bn, bk), NUM_PROGS=progs,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
    )
    return y.reshape(*x.shape[:-1], n)


# -------------------------------------------------------------------------- row kernels


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, D, stride_x, stride_y, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK):
        offs = d0 + tl.arange(0, BLOCK)
        xv = tl.load(x_row + offs, mask=offs < D, other=0.0).to(tl.float32)
        acc += xv * xv
    inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / D + eps)
    for d0 in range(0, D, BLOCK):
        offs = d0 + tl.arange(0, BLOCK)
        xv = tl.load(x_row + offs, mask=offs < D, other=0.0).to(tl.float32)
        wv = tl.load(w_ptr + offs, mask=offs < D, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * stride_y + offs, (xv * inv * wv).to(y_ptr.dtype.element_ty), mask=offs < D)


def _row_block(d: int) -> int:
    return min(ROW_BLOCK, triton.next_power_of_2(max(d, 16)))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    d = x.shape[-1]
    x2 = x.reshape(-1, d).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, weight.contiguous(), y, d, x2.stride(0), y.stride(0), float(eps),
                                         BLOCK=_row_block(d))
    return y.reshape(x.shape)


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, N, stride_x, stride_y, LOG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    m = tl.full((BLOCK,), float("-inf"), dtype=tl.float32)
    for n0 in range(0, N, BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        m = tl.maximum(m, tl.load(x_row + offs, mask=offs < N, other=float("-inf")).to(tl.float32))
    mx = tl.max(m, axis=0)
    s = tl.zeros((BLOCK,), dtype=tl.float32)
    for n0 in range(0, N, BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        xv = tl.load(x_row + offs, mask=offs < N, other=float("-inf")).to(tl.float32)
        s += tl.exp(xv - mx)
    total = tl.sum(s, axis=0)
    for n0 in range(0, N, BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        xv = tl.load(x_row + offs, mask=offs < N, other=0.0).to(tl.float32)
        if LOG:
            out = xv - mx - tl.log(total)
        else:
            out = tl.exp(xv - mx) / total
        tl.store(y_ptr + row * stride_y + offs, out.to(y_ptr.dtype.element_ty), mask=offs < N)


def _softmax(x: torch.Tensor, log: bool) -> torch.Tensor:
    n = x.shape[-1]
    x2 = x.reshape(-1, n).contiguous()
    y = torch.empty_like(x2)
    if x2.shape[0] and n:
        _softmax_kernel[(x2.shape[0],)](x2, y, n, x2.stride(0), y.stride(0), LOG=log, BLOCK=_row_block(n))
    return y.reshape(x.shape)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return _softmax(x.movedim(dim, -1), log=True).movedim(-1, dim)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    return _softmax(x.movedim(dim, -1), log=False).movedim(-1, dim)


# ---------------------------------------------------------------------------- attention


@triton.jit(do_not_specialize=["T"])
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, part_acc, part_ml, T, H, GROUP, MAX_SPLITS, scale,
                       s_qt, s_qh, s_ks, s_kh, s_vs, s_vh,
                       D: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr):
    # One program per (query, head, split): keys [split*SPLIT, min((split+1)*SPLIT, pos+1)).
    th = tl.program_id(0)
    split = tl.program_id(1)
    t = th // H
    h = th % H
    kvh = h // GROUP
    pos = tl.load(pos_ptr + t)
    start = split * SPLIT
    if start <= pos:
        end = tl.minimum(start + SPLIT, pos + 1)
        offs_d = tl.arange(0, D)
        q = tl.load(q_ptr + t * s_qt + h * s_qh + offs_d).to(tl.float32)
        # 0-d fp32 tensors from reductions: the same type the loop assigns to them
        m_i = tl.max(tl.full((BLOCK_N,), float("-inf"), tl.float32), axis=0)
        l_i = tl.sum(tl.zeros((BLOCK_N,), tl.float32), axis=0)
        acc = tl.zeros((D,), dtype=tl.float32)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            valid = offs_n < end
            k = tl.load(k_ptr + offs_n[:, None] * s_ks + kvh * s_kh + offs_d[None, :], mask=valid[:, None], other=0.0)
            scores = tl.sum(k.to(tl.float32) * q[None, :], axis=1) * scale
            scores = tl.where(valid, scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=0))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(scores - m_new)
            v = tl.load(v_ptr + offs_n[:, None] * s_vs + kvh * s_vh + offs_d[None, :], mask=valid[:, None], other=0.0)
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            m_i = m_new
        base = th * MAX_SPLITS + split
        tl.store(part_acc + base * D + offs_d, acc)
        tl.store(part_ml + base * 2, m_i)
        tl.store(part_ml + base * 2 + 1, l_i)


@triton.jit(do_not_specialize=["T"])
def _attn_combine_kernel(part_acc, part_ml, pos_ptr, o_ptr, T, H, MAX_SPLITS, s_ot, s_oh,
                         D: tl.constexpr, SPLIT: tl.constexpr):
    # Splits of one (query, head) combined in order 0, 1, 2, ...: an order fixed by pos alone.
    th = tl.program_id(0)
    t = th // H
    h = th % H
    pos = tl.load(pos_ptr + t)
    n_splits = pos // SPLIT + 1
    offs_d = tl.arange(0, D)
    m = tl.max(tl.full((D,), float("-inf"), tl.float32), axis=0)
    l_tot = tl.sum(tl.zeros((D,), tl.float32), axis=0)
    acc = tl.zeros((D,), dtype=tl.float32)
    for s in range(0, n_splits):
        base = th * MAX_SPLITS + s
        m_s = tl.load(part_ml + base * 2)
        l_s = tl.load(part_ml + base * 2 + 1)
        a_s = tl.load(part_acc + base * D + offs_d)
        m_new = tl.maximum(m, m_s)
        alpha = tl.exp(m - m_new)
        beta = tl.exp(m_s - m_new)
        acc = acc * alpha + a_s * beta
        l_tot = l_tot * alpha + l_s * beta
        m = m_new
    tl.store(o_ptr + t * s_ot + h * s_oh + offs_d, (acc / l_tot).to(o_ptr.dtype.element_ty))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float) -> torch.Tensor:
    """The `kernels.ops.attention` contract: q [T, H, D], k/v [S, KVH, D] (already holding
    the new keys), positions [T] -> [T, H, D]."""
    t, h, d = q.shape
    kvh = k.shape[1]
    if h % kvh:
        raise ValueError(f"attention: {h} query heads are not a multiple of {kvh} KV heads")
    if d & (d - 1):
        raise ValueError(f"attention: head dim {d} is not a power of two")
    out = torch.empty_like(q)
    if t == 0:
        return out
    pos = positions.to(device=q.device, dtype=torch.int32).contiguous()
    max_splits = int(positions.max().item()) // KV_SPLIT + 1
    part_acc = torch.empty(t * h * max_splits * d, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(t * h * max_splits * 2, dtype=torch.float32, device=q.device)
    q = q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    _attn_split_kernel[(t * h, max_splits)](
        q, k, v, pos, part_acc, part_ml, t, h, h // kvh, max_splits, float(scale),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        D=d, BLOCK_N=KV_BLOCK, SPLIT=KV_SPLIT,
    )
    _attn_combine_kernel[(t * h,)](part_acc, part_ml, pos, out, t, h, max_splits, out.stride(0), out.stride(1),
                                   D=d, SPLIT=KV_SPLIT)
    return out


@triton.jit(do_not_specialize=["T"])
def _kv_write_kernel(src_ptr, dst_ptr, pos_ptr, T, ROW: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(pos_ptr + t)
    for r0 in range(0, ROW, BLOCK):
        offs = r0 + tl.arange(0, BLOCK)
        tl.store(dst_ptr + pos * ROW + offs, tl.load(src_ptr + t * ROW + offs, mask=offs < ROW), mask=offs < ROW)


def write_kv(cache: torch.Tensor, new: torch.Tensor, positions: torch.Tensor) -> None:
    """cache [S, KVH, D] (contiguous) <- new [T, KVH, D] at rows `positions`."""
    t = new.shape[0]
    if t == 0:
        return
    row = new.shape[1] * new.shape[2]
    pos = positions.to(device=new.device, dtype=torch.int32).contiguous()
    _kv_write_kernel[(t,)](new.contiguous(), cache, pos, t, ROW=row, BLOCK=min(1024, triton.next_power_of_2(row)))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor,
                     v_new: torch.Tensor, positions: torch.Tensor, scale: float) -> torch.Tensor:
    """Write the new keys/values at `positions`, then attend: the cache is complete before
    any query reads it, so a query sees the same keys however the prompt was split."""
    write_kv(k_cache, k_new, positions)
    write_kv(v_cache, v_new, positions)
    s = int(positions.max().item()) + 1
    return attention(q, k_cache[:s], v_cache[:s], positions, scale)
