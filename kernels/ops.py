"""The ops the model calls. Each dispatches on the current kernel mode.

Contract (shapes are for one call; the engine may call per sequence):
- linear(x [..., K], weight [N, K], bias [N] | None) -> [..., N]
- rms_norm(x [..., D], weight [D], eps) -> [..., D]
- add_rms_norm(x [R, D], delta [R, D], weight [D], eps) -> [R, D]: x += delta in place, then
  rms_norm(x); swiglu(gate_up [R, 2F]) -> silu(gate) * up [R, F]
- softmax(x, dim=-1), log_softmax(x, dim=-1), silu_mul(gate, up) (SwiGLU)
- attention(q [T, H, D], k [S, KVH, D], v [S, KVH, D], positions [T] (int64, absolute
  positions of the queries), scale) -> [T, H, D]
  Causal over one sequence: query t attends keys 0..positions[t] of k/v, which already
  hold the new keys (the cache is written before attention reads it). H % KVH == 0
  (grouped-query attention).
- decode_attention(q [N, H, D], k [N, S, KVH, D], v [N, S, KVH, D], positions [N], scale)
  -> [N, H, D]: one decode query per sequence; sequence i's keys are k[i, :positions[i] + 1]
  and its rows after that are zero. Row i equals
  attention(q[i:i+1], k[i], v[i], positions[i:i+1], scale) (bit for bit when invariant).

The engine reaches the kernels only through this module (and kernels.mode, and
kernels.REVISION); besides the ops above it calls:
- rope(x [R, >= heads, D], heads, cos [P, D], sin [P, D], positions [R]) -> [R, heads, D]:
  rotary embedding of the first `heads` heads of each row (in place when compiled)
- topk(x [n, m], k) -> (values, indices) [n, k], like torch.topk(x, k)
- draw(probs [n, m], u [n] float64) -> [n] indices: each row's inverse-CDF draw
- block_weight(fmt, raw) -> a weight held only as GGUF blocks (a format in QUANT_FORMATS:
  Q4_1, Q8_0, Q4_K, Q5_0, Q5_K, Q6_K), which `linear` and `embedding` take in place of the
  fp32 [N, K] tensor of its values; None when the compiled kernel is not there or the shape
  does not fit it; block_weights([(fmt, raw), ...]) -> one such weight stacked from parts
  stored in different types (a fused q/k/v)
- embedding(weight [V, D] or a block weight, ids [R]) -> [R, D]: rows of the weight
- dense(weight) -> the fp32 tensor a weight stands for (a block weight expanded)
- describe() -> which of TTTR's own kernels run here, as the run fingerprint records it
- decode_layers(model, x [R, d], positions [R], segments) -> [R, d] or None: a pass whose rows
  each decode one token, all its layers in one compiled call (kernels.cdecode: the same
  kernels in the same order, so the same bits); None where it does not apply
Each picks the compiled kernel or the PyTorch formulation itself, so every caller gets the
same choice. rope, topk and draw give the same results either way; the compiled norms,
SwiGLU, attention and block products do not, which is why describe() records which ran.
Under `invariant`, softmax and log_softmax of whole 2-D CPU fp32 rows run compiled too
(kernels.crow: the sampler and the logprobs, the same C the torch-free path calls).

Whatever the mode, a weight held as GGUF blocks (kernels.cquant) is multiplied from them, and the row-local steps run compiled (kernels.crow) when a C compiler is there: both
are batch-invariant as they stand and faster than stock. Otherwise `fast` is stock PyTorch
(with, at decode sizes, the packed-weight MKL GEMM that PyTorch's own compiler emits) and
decodes with the compiled attention loop nest (kernels.cattention). `invariant` (kernels.invariant) gives each row a result that
does not depend on how many rows share the call or where the row sits, and the same
attention output for a query whether the prompt came in one prefill, in chunks, or
token by token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tttr.kernels import array_ops, cattention, cdecode, cq8, cquant, crow, invariant
from tttr.kernels.cquant import QuantWeight  # noqa: F401 - the engine names block weights as ops.QuantWeight
from tttr.kernels.cquant import linear as block_linear
from tttr.kernels.mode import INVARIANT_MODES, Q8, get_mode
from tttr.kernels.packing import HAS_MKL_PACK, PACK_ROWS, mkl_linear, packed_weights

# MKL's packed GEMM reads the packed weight once per PACK_ROWS-row panel: a win while the
# weight stays in cache between panels or there is one panel, a loss for the 113 MB head at
# 16 rows and more (measured: 17 vs 13 ms at 16 rows, 33 vs 17 at 32), and for a whole
# layer pass of the default model past 16 rows (a 30-row prefill: 75 vs 67 ms).
_PACKED_MAX_ROWS = 16
_ZERO = torch.zeros(1, dtype=torch.int64)
_CACHED_WEIGHT_BYTES = 16 << 20

QUANT_FORMATS = cquant.FORMATS  # the GGUF block formats block_weight takes: Q4_1, Q8_0, Q4_K, Q5_0, Q5_K, Q6_K


def linear(x: torch.Tensor, weight: torch.Tensor | QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    if weight.__class__ is QuantWeight:
        # Stored GGUF blocks (kernels.cquant): batch-invariant as they stand, so every mode;
        # `invariant-q8` quantizes the activations to 8 bits first (kernels.cq8)
        x2 = x.reshape(-1, x.shape[-1])
        q8 = get_mode() == Q8 and cq8.available() and cq8.supports(weight)
        out = (cq8.linear(x2, weight) if q8 else block_linear(x2, weight)).view(*x.shape[:-1], weight.shape[0])
        return out if bias is None else out + bias
    if get_mode() in INVARIANT_MODES:
        return invariant.linear(x, weight, bias)
    m = x.shape[0] if x.dim() == 2 else 0
    if 0 < m <= _PACKED_MAX_ROWS and HAS_MKL_PACK and x.dtype == torch.float32 \
            and weight.dtype == torch.float32 and not x.is_cuda and x.is_contiguous() and weight.is_contiguous() \
            and (m <= PACK_ROWS or weight.numel() * 4 <= _CACHED_WEIGHT_BYTES):
        out = mkl_linear(x, weight, packed_weights.get(weight))
        return out if bias is None else out + bias
    return F.linear(x, weight, bias)


def _row_kernels(*ts: torch.Tensor) -> bool:
    """The compiled row-local kernels (kernels.crow, batch-invariant: both modes) take these."""
    return crow.available() and all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in ts)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if _row_kernels(x, weight):
        return crow.rms_norm(x, weight, eps)
    if get_mode() in INVARIANT_MODES:
        return invariant.rms_norm(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The residual add then the next norm: x += delta in place; returns rms_norm(x) * weight."""
    if _row_kernels(x, delta, weight):
        return crow.add_rms_norm(x, delta, weight, eps)
    x += delta
    return rms_norm(x, weight, eps)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """[R, 2F] (gate then up, one fused product) -> silu(gate) * up [R, F]."""
    if gate_up.dim() == 2 and _row_kernels(gate_up):
        return crow.silu_mul(gate_up)
    f = gate_up.shape[-1] // 2
    return silu_mul(gate_up[..., :f], gate_up[..., f:])


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's `silu(gate) * up`. Stock `F.silu` computes the sigmoid differently in its
    vectorised body and its scalar tail, so a row's bits would depend on where the row
    falls against the vector width; the invariant form uses only exp and division, whose
    two forms agree bit for bit."""
    if get_mode() in INVARIANT_MODES:
        return gate / (1.0 + torch.exp(-gate)) * up
    return F.silu(gate) * up


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if get_mode() in INVARIANT_MODES:
        if _rows_2d(x, dim):
            return crow.softmax(x)
        return invariant.softmax(x, dim)
    return torch.softmax(x, dim=dim)


def _rows_2d(x: torch.Tensor, dim: int) -> bool:
    """Whole rows of a 2-D CPU fp32 tensor, which the compiled row kernels take."""
    return x.dim() == 2 and dim in (-1, 1) and _row_kernels(x)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if get_mode() in INVARIANT_MODES:
        if _rows_2d(x, dim):
            return crow.log_softmax(x)
        return invariant.log_softmax(x, dim)
    return torch.log_softmax(x, dim=dim)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float
) -> torch.Tensor:
    if get_mode() in INVARIANT_MODES:
        return invariant.attention(q, k, v, positions, scale)
    t, h, d = q.shape
    kvh = k.shape[1]
    if t == 1 and not q.is_cuda and cattention.available():
        # Decode: the compiled loop nest (one call, where stock attention takes eight ops)
        return cattention.attention(q, k[None], v[None], _ZERO, positions.reshape(1), scale)
    if t == 1:
        # Decode: one query per sequence. Grouped-query heads share their KV head through a
        # view, and two small batched products beat SDPA's set-up at this size; the scale
        # goes on the 576 query elements rather than the scores (exact when it is a power of
        # two, as for head dim 64).
        s = int(positions[0]) + 1
        qg = q.view(kvh, h // kvh, d) * scale
        p = torch.softmax(torch.bmm(qg, k[:s].permute(1, 2, 0)), dim=-1)
        return torch.bmm(p, v[:s].transpose(0, 1)).view(1, h, d)
    s = int(positions.max()) + 1
    k, v = k[:s], v[:s]
    mask = torch.arange(s, device=q.device)[None, :] <= positions[:, None]  # [T, S]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale,
        enable_gqa=h != kvh,
    )
    return out.transpose(0, 1)


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: list[int] | torch.Tensor, scale: float,
) -> torch.Tensor:
    """One decode query for each of N sequences at once (see the module contract)."""
    if get_mode() in INVARIANT_MODES:
        return invariant.decode_attention(q, k, v, positions, scale)
    n, h, d = q.shape
    if not q.is_cuda and cattention.available():
        return cattention.attention(q, k, v, torch.arange(n), torch.as_tensor(positions, dtype=torch.int64), scale)
    if n == 1:
        return attention(q, k[0], v[0], torch.as_tensor(positions, dtype=torch.int64).view(1), scale)
    pos = torch.as_tensor(positions, dtype=torch.int64)
    s = int(pos.max()) + 1
    # Strided views straight into the cache (no gather); SDPA shares each KV head with its
    # query group itself. Rows past a position are masked out.
    mask = (torch.arange(s)[None, :] <= pos[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(
        q[:, :, None, :], k[:, :s].transpose(1, 2), v[:, :s].transpose(1, 2), attn_mask=mask, scale=scale,
        enable_gqa=h != k.shape[2],
    )
    return out[:, :, 0, :]


# -- the rest of what the engine needs --------------------------------------------------------


def rope(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The first `heads` heads of x [R, >= heads, D] rotated by the table rows cos/sin [P, D] at
    `positions` [R] (int64): x * cos + roll(x, D/2) * sin, where sin is the model's table with
    its first half negated (rotate_half folded in). Returns [R, heads, D]: compiled
    (kernels.crow) for fp32 CPU rows whose heads are contiguous, rotating those heads of x in
    place and returning a view of them; else the same formula in PyTorch, returning a new
    contiguous tensor and leaving x as it was. The same values either way (three rounded
    operations in the same order); the layouts differ as they always have, and stock
    attention's bits follow the layout, so callers use the return value and not x."""
    d = x.shape[-1]
    if x.dtype == torch.float32 and not x.is_cuda and x.stride(2) == 1 and x.stride(1) == d \
            and _row_kernels(cos, sin):
        crow.rope_(x, heads, cos, sin, positions)
        return x[:, :heads]
    qk = x[:, :heads]
    c = cos.index_select(0, positions)[:, None, :]
    s = sin.index_select(0, positions)[:, None, :]
    return qk * c + torch.roll(qk, d // 2, -1) * s


def topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k largest of each row of x [n, m], largest first, like
    torch.topk(x, k, dim=-1): the compiled single scan (kernels.crow, rows in parallel; the
    lower index first among equals) for contiguous fp32 CPU rows and k <= crow.TOPK_MAX,
    else torch.topk."""
    if 0 < k <= crow.TOPK_MAX and _row_kernels(x):
        return crow.topk(x, k)
    return torch.topk(x, k, dim=-1)


def draw(probs: torch.Tensor, u: torch.Tensor) -> list[int]:
    """Inverse CDF for each row of probs [n, m] (non-negative, unnormalised): the first index
    whose running sum, accumulated in float64 entry by entry, exceeds u[i] (float64 in
    [0, 1)) times the row's total; clamped to m - 1. Compiled (kernels.crow, no cumulative
    array) for contiguous fp32 CPU rows, else torch.cumsum and torch.searchsorted: the same
    index either way."""
    if _row_kernels(probs):
        return crow.draw(probs, u)
    cdf = torch.cumsum(probs.double(), -1)
    idx = torch.searchsorted(cdf, u.to(torch.float64).reshape(-1, 1) * cdf[:, -1:], right=True)
    return idx.clamp_(max=cdf.shape[1] - 1).flatten().tolist()


def block_weight(fmt: str, raw) -> QuantWeight | None:
    """A weight held only as its GGUF blocks, for `linear` and `embedding` in place of the fp32
    [N, K] tensor of its values: `raw` is the GGUF tensor's bytes as rows (numpy uint8
    [N, bytes], permuted or concatenated as the weight's rows are), `fmt` one of
    QUANT_FORMATS. None when the compiled kernel is not there or the shape does not fit it
    (rows % 16, inputs % 256 for the K-quants): the caller keeps the dense weight."""
    return block_weights([(fmt, raw)])


def blocks_available() -> bool:
    """Whether the compiled block products are built here (without them `block_weights` is None)."""
    return cquant.available()


def block_weights(parts) -> QuantWeight | None:
    """One weight whose rows are the parts' rows one after another, each part (fmt, raw) as
    for `block_weight` and its own type (a fused q/k/v stored as Q4_K, Q4_K and Q6_K): the
    product runs from every part's blocks in one call. None when any part does not fit."""
    return cquant.block_weights(parts)


def embedding(weight: torch.Tensor | QuantWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` (int64 [R]) of weight [V, D]: for a block weight, just those rows expanded
    to the values the dense weight would hold."""
    if weight.__class__ is QuantWeight:
        return weight.rows(ids)
    return weight.index_select(0, ids)


def dense(weight: torch.Tensor | QuantWeight) -> torch.Tensor:
    """The fp32 tensor a weight stands for (a block weight expanded, a new tensor each call)."""
    return weight.dense() if weight.__class__ is QuantWeight else weight


def decode_layers(model, x: torch.Tensor, positions: torch.Tensor, segments) -> torch.Tensor | None:
    """The layers of a pass whose rows each decode one token, in one compiled call: x [R, d]
    the embedded tokens (updated in place), returns the final norm's output [R, d], the bits
    the per-op path gives (under `invariant-q8`, with kernels.cq8's products as `linear` takes
    them); None when the model or pass is not one it runs (kernels.cdecode)."""
    return cdecode.decode(model, x, positions, segments, q8=get_mode() == Q8 and cq8.available())


def describe() -> dict:
    """Which of TTTR's own kernels run here, as the run fingerprint records them (one
    definition, torch-free: kernels.array_ops.describe)."""
    return array_ops.describe()
