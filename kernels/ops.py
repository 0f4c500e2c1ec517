"""The ops the model calls. Each dispatches on the current kernel mode.

Contract (shapes are for one call; the engine may call per sequence):
- linear(x [..., K], weight [N, K], bias [N] | None) -> [..., N]
- rms_norm(x [..., D], weight [D], eps) -> [..., D]
- softmax(x, dim=-1), log_softmax(x, dim=-1), silu_mul(gate, up) (SwiGLU)
- attention(q [T, H, D], k [S, KVH, D], v [S, KVH, D], positions [T] (int64, absolute
  positions of the queries), scale) -> [T, H, D]
  Causal over one sequence: query t attends keys 0..positions[t] of k/v, which already
  hold the new keys (the cache is written before attention reads it). H % KVH == 0
  (grouped-query attention).
- decode_attention(q [N, H, D], ks, vs (lists of N [S_i, KVH, D]), positions [N], scale)
  -> [N, H, D]: one decode query per sequence, row i equal to
  attention(q[i:i+1], ks[i], vs[i], positions[i:i+1], scale) (bit for bit when invariant).

`fast` is stock PyTorch. `invariant` (kernels.invariant) gives each row a result that
does not depend on how many rows share the call or where the row sits, and the same
attention output for a query whether the prompt came in one prefill, in chunks, or
token by token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.mode import get_mode


def _invariant():
    from kernels import invariant  # noqa: PLC0415 - the invariant kernels load on first use

    return invariant


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    if get_mode() == "invariant":
        return _invariant().linear(x, weight, bias)
    return F.linear(x, weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if get_mode() == "invariant":
        return _invariant().rms_norm(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's `silu(gate) * up`. Stock `F.silu` computes the sigmoid differently in its
    vectorised body and its scalar tail, so a row's bits would depend on where the row
    falls against the vector width; the invariant form uses only exp and division, whose
    two forms agree bit for bit."""
    if get_mode() == "invariant":
        return gate / (1.0 + torch.exp(-gate)) * up
    return F.silu(gate) * up


def softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if get_mode() == "invariant":
        return _invariant().softmax(x, dim)
    return torch.softmax(x, dim=dim)


def log_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    if get_mode() == "invariant":
        return _invariant().log_softmax(x, dim)
    return torch.log_softmax(x, dim=dim)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor, scale: float
) -> torch.Tensor:
    if get_mode() == "invariant":
        return _invariant().attention(q, k, v, positions, scale)
    t, h, d = q.shape
    kvh = k.shape[1]
    s = int(positions.max()) + 1
    k, v = k[:s], v[:s]
    if t == 1:
        # Decode: one query per sequence. Grouped-query heads share their KV head through a
        # view, and two small matmuls beat SDPA's set-up at this size.
        qg = q.view(kvh, h // kvh, d)
        p = torch.softmax(torch.matmul(qg, k.permute(1, 2, 0)) * scale, dim=-1)
        return torch.matmul(p, v.transpose(0, 1)).reshape(1, h, d)
    mask = torch.arange(s, device=q.device)[None, :] <= positions[:, None]  # [T, S]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale,
        enable_gqa=h != kvh,
    )
    return out.transpose(0, 1)


def decode_attention(
    q: torch.Tensor, ks: list[torch.Tensor], vs: list[torch.Tensor], positions: list[int] | torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One decode query for each of N sequences at once (see the module contract)."""
    if get_mode() == "invariant":
        return _invariant().decode_attention(q, ks, vs, positions, scale)
    pos = positions.tolist() if isinstance(positions, torch.Tensor) else [int(p) for p in positions]
    return torch.cat([attention(q[i : i + 1], ks[i], vs[i], torch.tensor([p]), scale) for i, p in enumerate(pos)])
