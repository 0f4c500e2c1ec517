"""Batch-invariant ops on the CPU (PyTorch), with the signatures of `kernels.ops`.

A row's result depends only on the row: not on how many rows share the call, where the
row sits, what else is there, nor (for attention) on whether the prompt came in one
prefill, in chunks, or token by token. How each op gets there:

(kernels.ops sends a weight with GGUF blocks to kernels.cquant and, with a C compiler,
RMSNorm to kernels.crow, in either mode: both are batch-invariant by construction. What
follows is what runs for dense weights and without a compiler.)

- linear: MKL's packed GEMM (`cblas_sgemm_pack` once per weight, `cblas_sgemm_compute`
  per call). With the weight packed for an 8-row panel, MKL runs the same micro-kernel
  and the same K-order for every row count, so row results are identical for 1..256
  rows, at 1 to 4 threads, and the packing cost is paid once, not per call: it is as
  fast as stock at 1 row and faster at 8. Calls are cut into pieces of at most
  `MAX_ROWS` rows so every product stays inside the range the test suite verifies
  (MKL's invariance is an observation, tested per shape of the default model, not a
  documented guarantee). Each weight is probed once; where MKL varies (small weights)
  or is missing, fixed 8-row tiles of a plain GEMM, or else an exact fixed-order product.
- reductions (RMSNorm, softmax, log-softmax): a row shorter than 16k elements is summed
  by one inner-dimension reduction, whose order torch fixes by the row length alone; a
  longer row (the vocabulary) is cut into fixed blocks of `REDUCE_BLOCK` elements, each
  summed with one fixed-length reduction, and the block sums are combined by a
  sequential scan (`cumsum`), so no thread split can reorder it. The max is exact in any
  order. Only exp, log, rsqrt and + - * / touch elements, whose vectorised and scalar
  forms agree bit for bit here (sigmoid's do not).
- attention: where a C compiler exists, one compiled loop nest (kernels.cattention) that
  computes each (query, head) by itself in an order fixed by the head dim and the keys it
  attends. Otherwise the blocked formulation below: a query attends keys 0..pos in fixed
  blocks of `KV_BLOCK` keys; keys past pos are masked to an exact 0. Each (key block, KV
  head) is one item of a batched matmul whose inner dimensions are fixed (the head dim,
  the block size) and whose rows are cut into tiles of exactly `ATTN_ROWS` rows, so MKL
  sees the same product whatever the call holds (a plain `bmm` of the item's rows is not
  row-invariant everywhere: on an AMD EPYC, 1 to 3 rows take another kernel); a probe
  checks that once per shape, else an exact fixed-order product. The block partial sums
  are combined by a scan, so the result does not depend on how many queries or keys the
  call holds. The two give different bits (each invariant); `attention_kernel()` says
  which runs and the run fingerprint records it.

On CUDA tensors the ops run the Triton kernels (kernels.triton_kernels).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

from tttr.kernels import cattention
from tttr.kernels.packing import HAS_MKL_PACK, PACK_ROWS, WeightCache, mkl_linear, packed

MAX_ROWS = 256  # longest row range one GEMM call gets (the range the suite verifies)
REDUCE_BLOCK = 64  # elements per fixed-length partial sum of a long row
_REDUCE_GRAIN = 16384  # rows shorter than this are summed in one pass (half of torch's grain)
KV_BLOCK = 64  # keys per attention block
_ATTN_CHUNK_ELEMS = 1 << 22  # bound on the score elements of one attention chunk (16 MiB)
ATTN_ROWS = 8  # rows of every attention GEMM item (the blocked formulation)
_EXACT_ELEMS = 1 << 22  # bound on the products of one exact attention step



def _triton():
    from tttr.kernels import triton_kernels  # noqa: PLC0415 - start-up: triton takes ~0.2 s and is needed on CUDA tensors only

    return triton_kernels


# --------------------------------------------------------------------------- linear


def _linear_tiles(x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Every GEMM has exactly PACK_ROWS rows, so the call shape never varies."""
    m = x2.shape[0]
    padded = x2.new_zeros(-(-m // PACK_ROWS) * PACK_ROWS, x2.shape[1])
    padded[:m] = x2
    tiles = [F.linear(padded[i : i + PACK_ROWS], weight) for i in range(0, padded.shape[0], PACK_ROWS)]
    return torch.cat(tiles)[:m]


def _linear_exact(x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Invariant by construction (exact products, fixed-order sums); slow, for small weights."""
    n, k = weight.shape
    rows = max(1, (1 << 22) // max(1, n * k))
    out = [_row_sum((x2[i : i + rows, None, :] * weight[None]).reshape(-1, k)).reshape(-1, n)
           for i in range(0, x2.shape[0], rows)]
    return torch.cat(out)


def _choose(weight: torch.Tensor) -> tuple[str, torch.Tensor | None]:
    """Which GEMM keeps this weight's rows invariant here, decided once by a probe, and for
    MKL the packed copy (shared with the fast kernels, see kernels.packing).

    MKL picks kernels by problem size: for small weights (roughly N*K < 20k) a 1-row
    product takes another path than a 2-row one even when packed, so every weight is
    probed with row counts 1..17 and falls back to a slower path that passes."""
    probe = torch.randn(17, weight.shape[1], generator=torch.Generator().manual_seed(0))
    candidates = []
    if HAS_MKL_PACK:
        pk = packed(weight)
        candidates.append(("mkl", pk, lambda x: mkl_linear(x, weight, pk)))
    candidates.append(("tiles", None, lambda x: _linear_tiles(x, weight)))
    for name, pk, fn in candidates:
        full = fn(probe)
        if all(torch.equal(fn(probe[:m].contiguous()), full[:m]) for m in (1, 2, 3, 4, 5, 7, 8, 9, 16)) \
                and torch.equal(fn(probe[1:].contiguous()), full[1:]):
            return name, pk
    return "exact", None


_prepared = WeightCache(_choose)  # weight -> (path, packed copy or None)


def linear_path(weight: torch.Tensor) -> str:
    """The GEMM path the invariant linear takes for an fp32 contiguous weight: mkl, tiles or exact."""
    return _prepared.get(weight)[0]


def _linear_rows(x2: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[M, K] @ [N, K]^T for contiguous fp32, M <= MAX_ROWS."""
    path, pk = _prepared.get(weight)
    if path == "mkl":
        return mkl_linear(x2, weight, pk)
    if path == "tiles":
        return _linear_tiles(x2, weight)
    return _linear_exact(x2, weight)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    # The common case first, with as little Python as possible: it runs ~120 times a token.
    if x.dim() == 2 and bias is None and x.dtype == torch.float32 and x.shape[0] <= MAX_ROWS \
            and x.is_contiguous() and not x.is_cuda:
        entry = _prepared.entries.get(id(weight))
        if entry is not None and entry[2][0] == "mkl" and entry[0]() is weight and entry[1] == weight._version \
                and x.shape[0] > 0:
            return torch.ops.mkl._mkl_linear(x, entry[2][1], weight, None, x.shape[0])
    if x.is_cuda:
        return _triton().linear(x, weight, bias)
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"linear: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}: "
            "x's last dimension must equal weight.shape[1]"
        )
    out_dtype = x.dtype
    n, k = weight.shape
    if weight.dtype != torch.float32 or not weight.is_contiguous():
        weight = _fp32_weight(weight)
    x2 = x.reshape(-1, k).to(torch.float32).contiguous()
    m = x2.shape[0]
    if m == 0:
        out = x2.new_zeros(0, n)
    elif m <= MAX_ROWS:
        out = _linear_rows(x2, weight)
    else:
        out = torch.cat([_linear_rows(x2[i : i + MAX_ROWS], weight) for i in range(0, m, MAX_ROWS)])
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.reshape(*x.shape[:-1], n).to(out_dtype)


_fp32_keep: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


def _fp32_weight(weight: torch.Tensor) -> torch.Tensor:
    """An fp32 contiguous copy of a weight, kept while the weight lives (so it packs once)."""
    key = id(weight)
    entry = _fp32_keep.get(key)
    if entry is not None and entry[0]() is weight:
        return entry[1]
    copy = weight.detach().to(torch.float32).contiguous()
    _fp32_keep[key] = (weakref.ref(weight, lambda _r, k=key: _fp32_keep.pop(k, None)), copy)
    return copy


# ----------------------------------------------------------------------- reductions


def _row_sum(x2: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim of contiguous fp32 [R, D] -> [R, 1], in an order fixed by D alone."""
    r, d = x2.shape
    if d < _REDUCE_GRAIN:
        # TensorIterator reduces each row of a contiguous [R, D] with the same vectorised
        # inner loop and splits work across rows only; it splits a row across threads only
        # when the whole reduction is one row of at least its grain (32768) elements.
        return x2.sum(-1, keepdim=True)
    nb = -(-d // REDUCE_BLOCK)
    if nb * REDUCE_BLOCK != d:
        x2 = F.pad(x2, (0, nb * REDUCE_BLOCK - d))  # zeros add exactly nothing
    partial = x2.reshape(r, nb, REDUCE_BLOCK).sum(-1)
    return partial.cumsum(-1)[:, -1:]


def _as_rows(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    moved = x.movedim(dim, -1)
    return moved, moved.reshape(-1, moved.shape[-1]).to(torch.float32).contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.is_cuda:
        return _triton().rms_norm(x, weight, eps)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.dtype != torch.float32 or not x2.is_contiguous():
        x2 = x2.to(torch.float32).contiguous()
    mean_sq = _row_sum(x2 * x2) / x2.shape[1]
    out = x2 * torch.rsqrt(mean_sq + eps) * weight.to(torch.float32)
    return out.reshape(x.shape).to(x.dtype)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if x.is_cuda and dim in (-1, x.dim() - 1):
        return _triton().log_softmax(x)
    moved, x2 = _as_rows(x, dim)
    if x2.shape[1] == 0:
        return x.clone()
    shifted = x2 - x2.amax(-1, keepdim=True)
    out = shifted - torch.log(_row_sum(torch.exp(shifted)))
    return out.reshape(moved.shape).movedim(-1, dim).to(x.dtype)


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    moved, x2 = _as_rows(x, dim)
    if x2.shape[1] == 0:
        return x.clone()
    e = torch.exp(x2 - x2.amax(-1, keepdim=True))
    out = e / _row_sum(e)
    return out.reshape(moved.shape).movedim(-1, dim).to(x.dtype)


# ------------------------------------------------------------------------ attention


# Every GEMM of the blocked attention goes through `_block_bmm`: a batch of [R, K] x [K, N]
# products, with K and N fixed by the head dim and KV_BLOCK, and R (queries times heads per
# KV head) varying with the call. A plain `bmm` gives a row the same bits whatever R is only
# where MKL happens to run one kernel for every R (the suite found it did on the Intel Xeons
# of earlier sessions; on an AMD EPYC with the AVX2 build, 1 to 3 rows take another path).
# So R never reaches MKL: the rows are cut into tiles of exactly ATTN_ROWS rows (zero
# padded), and every item MKL sees is the same [ATTN_ROWS, K] x [K, N] product on the same
# contiguous layouts. That is probed once per (K, N); where it varies, an exact fixed-order
# product (elementwise products summed over K by one fixed-length reduction, as
# `_linear_exact`).


def _bmm_tiles(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[I, R, K] x [I, K, N] -> [I, R, N] as I * ceil(R / ATTN_ROWS) products of ATTN_ROWS rows."""
    i, r, k = a.shape
    n = b.shape[2]
    tiles = -(-r // ATTN_ROWS)
    padded = a.new_zeros(i, tiles * ATTN_ROWS, k)
    padded[:, :r] = a
    # b contiguous, then one copy per tile (a view when there is one tile: the same layout)
    bt = b.contiguous()[:, None].expand(i, tiles, k, n).reshape(i * tiles, k, n)
    out = torch.bmm(padded.view(i * tiles, ATTN_ROWS, k), bt)
    return out.view(i, tiles * ATTN_ROWS, n)[:, :r]


def _bmm_exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[I, R, K] x [I, K, N] -> [I, R, N], invariant by construction; slow, the last resort."""
    i, r, k = a.shape
    n = b.shape[2]
    a = a.contiguous()
    bt = b.transpose(1, 2).contiguous()  # [I, N, K]
    step = max(1, _EXACT_ELEMS // max(1, i * n * k))
    out = [_row_sum((a[:, s : s + step, None, :] * bt[:, None]).reshape(-1, k)).reshape(i, -1, n)
           for s in range(0, r, step)]
    return torch.cat(out, 1)


_BMM_PATHS = {"tiles": _bmm_tiles, "exact": _bmm_exact}


def _choose_bmm(k: int, n: int) -> str:
    """"tiles" where its rows do not depend on the row count, the row's place in a tile, the
    item count or the neighbours, for [*, K] x [K, N] items (a probe over 1..40 rows at
    several offsets, 1, 3 and 5 items), else "exact"."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 40, k, generator=g)
    b = torch.randn(5, n, k, generator=g).transpose(1, 2)  # as the keys arrive: a transposed view
    full = _bmm_tiles(a, b)
    if not (torch.equal(_bmm_tiles(a.contiguous(), b.contiguous()), full)
            and torch.equal(_bmm_tiles(a[2:], b[2:]), full[2:])):
        return "exact"
    for r in (1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 24, 33):
        for off in (0, 3, 40 - r):
            rows = slice(off, off + r)
            if not (torch.equal(_bmm_tiles(a[:, rows], b), full[:, rows])
                    and torch.equal(_bmm_tiles(a[:1, rows], b[:1]), full[:1, rows])):
                return "exact"
    return "tiles"


_bmm_paths: dict[tuple[int, int], str] = {}


def attention_gemm(k: int, n: int) -> str:
    """The GEMM path the blocked attention takes for [*, K] x [K, N] items: tiles or exact."""
    path = _bmm_paths.get((k, n))
    if path is None:
        path = _bmm_paths[(k, n)] = _choose_bmm(k, n)
    return path


def _block_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`torch.bmm(a, b)` for fp32 [I, R, K] x [I, K, N], each row's bits independent of R."""
    return _BMM_PATHS[attention_gemm(a.shape[2], b.shape[2])](a, b)


def _compiled():
    """kernels.cattention when it built here, else None (the blocked PyTorch formulation)."""
    return cattention if cattention.available() else None


def attention_kernel() -> str:
    """Which invariant attention runs on the CPU here: "compiled" or "blocked" (the two give
    different bits, each invariant; the run fingerprint records it)."""
    return "compiled" if _compiled() is not None else "blocked"


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float
) -> torch.Tensor:
    if q.is_cuda:
        return _triton().attention(q, k, v, positions, scale)
    c = _compiled()
    if c is not None and q.shape[0]:
        out = c.attention(q, k[None], v[None], torch.zeros(q.shape[0], dtype=torch.int64),
                          positions.reshape(-1), scale)
        return out.to(q.dtype)
    t, h, d = q.shape
    kvh = k.shape[1]
    if h % kvh:
        raise ValueError(f"attention: {h} query heads are not a multiple of {kvh} KV heads")
    if t == 0:
        return q.new_zeros(0, h, d)
    if t == 1:
        # Decode: the batched decode kernel with one sequence, so that a sequence decoding
        # alone and one decoding next to others run the very same arithmetic.
        n_keys = int(positions.reshape(-1)[0]) + 1
        return decode_attention(q, k[None, :n_keys], v[None, :n_keys], [n_keys - 1], scale)
    pos = positions.to(torch.int64)
    qg = q.to(torch.float32).reshape(t, kvh, h // kvh, d)
    kf = k.to(torch.float32)
    vf = v.to(torch.float32)
    # Queries in chunks bound the temporaries; a query's result does not depend on its chunk.
    n_keys = int(pos.max().item()) + 1
    per_query = -(-n_keys // KV_BLOCK) * KV_BLOCK * h  # scores/probabilities per query
    chunk = max(1, min(2 * KV_BLOCK, _ATTN_CHUNK_ELEMS // per_query))  # causal: later blocks only for later chunks
    if t <= chunk:
        return _attention_chunk(qg, kf, vf, pos, scale, n_keys).reshape(t, h, d).to(q.dtype)
    out = torch.empty(t, kvh, h // kvh, d, dtype=torch.float32)
    for start in range(0, t, chunk):
        sl = slice(start, start + chunk)
        out[sl] = _attention_chunk(qg[sl], kf, vf, pos[sl], scale)
    return out.reshape(t, h, d).to(q.dtype)


def _attention_chunk(
    qg: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, scale: float, n_keys: int | None = None
) -> torch.Tensor:
    """qg [T, KVH, G, D], k/v [S, KVH, D] fp32 -> [T, KVH, G, D].

    One `_block_bmm` item per (key block, KV head): [T*G, D] x [D, B] for the scores and
    [T*G, B] x [B, D] for the values, with B = KV_BLOCK and D fixed, each cut into products
    of ATTN_ROWS rows, so each row gets the same bits whatever T is (the suite checks
    chunkings, token by token and batched decode against prefill), and the per-block
    partial sums are combined by a sequential scan over blocks."""
    t, kvh, g, d = qg.shape
    if n_keys is None:
        n_keys = int(pos.max().item()) + 1
    nb = -(-n_keys // KV_BLOCK)
    span = nb * KV_BLOCK
    kb, vb = k[:n_keys], v[:n_keys]
    if span != n_keys:
        kb = F.pad(kb, (0, 0, 0, 0, 0, span - n_keys))
        vb = F.pad(vb, (0, 0, 0, 0, 0, span - n_keys))
    items = nb * kvh
    # keys as [items, KV_BLOCK, D] blocks, multiplied through a transposed view: MKL takes
    # the transpose as an operand flag, which is far cheaper than a transposing copy
    kt = kb.reshape(nb, KV_BLOCK, kvh, d).permute(0, 2, 1, 3).reshape(items, KV_BLOCK, d).transpose(1, 2)
    vb = vb.reshape(nb, KV_BLOCK, kvh, d).permute(0, 2, 1, 3).reshape(items, KV_BLOCK, d)
    rows = qg.permute(1, 0, 2, 3).reshape(1, kvh, t * g, d).expand(nb, kvh, t * g, d)

    scores = _block_bmm(rows.reshape(items, t * g, d), kt).reshape(nb, kvh, t, g, KV_BLOCK) * scale
    key_idx = torch.arange(span).reshape(nb, 1, 1, 1, KV_BLOCK)
    scores = scores.masked_fill(key_idx > pos.reshape(1, 1, t, 1, 1), float("-inf"))

    m = scores.amax(dim=(0, 4), keepdim=True)  # exact in any order
    p = torch.exp(scores - m)  # masked keys -> exactly 0
    denom = p.sum(-1).cumsum(0)[-1]  # [KVH, T, G]: fixed-length block sums, then a scan

    pv = _block_bmm(p.reshape(items, t * g, KV_BLOCK), vb).reshape(nb, kvh, t, g, d)
    out = pv.cumsum(0)[-1] / denom[..., None]  # [KVH, T, G, D]
    return out.permute(1, 0, 2, 3)


_plans: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _decode_plan(pos: tuple[int, ...], nb: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The key mask [N, nb, 1, 1, KV_BLOCK], each sequence's last block, and arange(N) for
    these positions: the same for every layer of a pass, so made once per pass."""
    plan = _plans.get((pos, nb))
    if plan is None:
        if len(_plans) > 256:
            _plans.clear()
        n = len(pos)
        key_idx = torch.arange(nb * KV_BLOCK).view(1, nb, 1, 1, KV_BLOCK)
        mask = key_idx > torch.tensor(pos, dtype=torch.int64).view(n, 1, 1, 1, 1)
        last = torch.tensor([p // KV_BLOCK for p in pos], dtype=torch.int64)
        plan = _plans[(pos, nb)] = (mask, last, torch.arange(n))
    return plan


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: list[int] | torch.Tensor, scale: float,
) -> torch.Tensor:
    """One decode query for each of N sequences: q [N, H, D]; k, v [N, S, KVH, D], where
    sequence i's keys 0..positions[i] are k[i, :positions[i] + 1] and its rows after that are
    zero (the engine's KV pool keeps them so) -> [N, H, D].

    Row i is bit for bit `attention(q[i:i+1], k[i], v[i], positions[i:i+1], scale)`, whatever
    the other rows are, and equal to that query's row in a prefill. It is `_attention_chunk`
    with T = 1 for every sequence at once: the keys are laid out as [N, blocks, KVH] items of
    the same [G, D] x [D, KV_BLOCK] and [G, KV_BLOCK] x [KV_BLOCK, D] products (through
    `_block_bmm`, the same ATTN_ROWS-row GEMMs as a prefill); keys past a sequence's
    position are masked to an exact 0 weight on zero values, and each sequence's block scan
    is read at its own last block, so the blocks past it never enter its sums."""
    if q.is_cuda:
        return torch.cat([_triton().attention(q[i : i + 1], k[i], v[i],
                                              torch.as_tensor([int(positions[i])], device=q.device), scale)
                          for i in range(q.shape[0])])
    n, h, d = q.shape
    if n == 0:
        return q.new_zeros(0, h, d)
    c = _compiled()
    if c is not None:
        pos_t = torch.as_tensor(positions, dtype=torch.int64)
        return c.attention(q, k, v, torch.arange(n), pos_t, scale).to(q.dtype)
    kvh = k.shape[2]
    if h % kvh:
        raise ValueError(f"attention: {h} query heads are not a multiple of {kvh} KV heads")
    pos = positions.tolist() if isinstance(positions, torch.Tensor) else [int(p) for p in positions]
    g = h // kvh
    nbs = [p // KV_BLOCK + 1 for p in pos]
    nb = max(nbs)
    span = nb * KV_BLOCK
    items = n * nb * kvh
    kb, vb = k[:, :span].float(), v[:, :span].float()
    if kb.shape[1] < span:  # zero keys and values up to the block boundary
        kb = F.pad(kb, (0, 0, 0, 0, 0, span - kb.shape[1]))
        vb = F.pad(vb, (0, 0, 0, 0, 0, span - vb.shape[1]))
    kt = kb.reshape(n, nb, KV_BLOCK, kvh, d).permute(0, 1, 3, 2, 4).reshape(items, KV_BLOCK, d).transpose(1, 2)
    vt = vb.reshape(n, nb, KV_BLOCK, kvh, d).permute(0, 1, 3, 2, 4).reshape(items, KV_BLOCK, d)
    rows = q.to(torch.float32).reshape(n, 1, kvh, g, d).expand(n, nb, kvh, g, d).reshape(items, g, d)

    # The same arithmetic as _attention_chunk, op for op; in place where the value is fresh,
    # and for a lone sequence (every decode step of a single stream) with plain slicing in
    # place of masks and gathers, which are most of this function's cost at that size.
    scores = _block_bmm(rows, kt).reshape(n, nb, kvh, g, KV_BLOCK).mul_(scale)
    if n == 1:
        scores[0, nb - 1, :, :, pos[0] + 1 - (nb - 1) * KV_BLOCK:] = float("-inf")
    else:
        mask, last, seq = _decode_plan(tuple(pos), nb)
        scores.masked_fill_(mask, float("-inf"))

    m = scores.amax(dim=(1, 4), keepdim=True)  # exact in any order
    p = scores.sub_(m).exp_()  # masked keys -> exactly 0
    pv = _block_bmm(p.view(items, g, KV_BLOCK), vt).reshape(n, nb, kvh, g, d)
    if n == 1:
        denom = p.sum(-1).cumsum(1)[0, nb - 1]
        out = pv.cumsum(1)[0, nb - 1] / denom[..., None]  # [KVH, G, D]
    else:
        denom = p.sum(-1).cumsum(1)[seq, last]  # [N, KVH, G]: the scan read at the sequence's last block
        out = pv.cumsum(1)[seq, last] / denom[..., None]  # [N, KVH, G, D]
    return out.reshape(n, h, d).to(q.dtype)

__all__ = ["linear", "rms_norm", "softmax", "log_softmax", "attention", "decode_attention", "KV_BLOCK", "PACK_ROWS",
           "ATTN_ROWS"]

