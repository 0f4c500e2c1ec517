"""The kernel half of `tttr bench gpu` (gpu.py has the engine half): the
Triton invariant products and attention, as the engine calls them (kernels/invariant.py routes
CUDA tensors to Triton), against stock torch (cuBLAS, SDPA) at a model's decode and prefill
shapes, summed over a forward pass: `invariant_over_cublas` = stock time / invariant time. On
the CPU (no CUDA) the Triton kernels run under the interpreter (TRITON_INTERPRET=1, set before
triton is imported) at a tiny shape: a check that the script runs, not a speed figure."""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F


class KernelShape:
    def __init__(self, layers, d, heads, kv_heads, head_dim, ffn, vocab):
        self.layers, self.d, self.heads, self.kv_heads, self.head_dim = layers, d, heads, kv_heads, head_dim
        self.ffn, self.vocab = ffn, vocab

    def products(self) -> dict[str, tuple[int, int]]:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return {"qkv": (q + 2 * kv, self.d), "o": (self.d, q), "gate_up": (2 * self.ffn, self.d),
                "down": (self.d, self.ffn)}


SHAPES = {"smollm2-135m": KernelShape(30, 576, 9, 3, 64, 1536, 49152),
          "llama-1b": KernelShape(16, 2048, 32, 8, 64, 8192, 49152)}
TINY = {"tiny": KernelShape(2, 64, 4, 2, 16, 96, 256)}


def _timer(device: torch.device):
    if device.type == "cuda":
        from triton.testing import do_bench

        def cuda(fn) -> float:
            return do_bench(fn, warmup=10, rep=50) * 1e3  # ms -> us

        return cuda

    def cpu(fn) -> float:  # the interpreter: one call, a figure that only shows the script runs
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6

    return cpu


def _sdpa(q, k, v, pos, scale):
    """Stock attention over one sequence's keys 0..max(pos): q [T, H, D], k/v [S, KVH, D]."""
    h, kvh = q.shape[1], k.shape[1]
    n = int(pos.max()) + 1
    mask = torch.arange(n, device=q.device)[None, :] <= pos[:, None]
    return F.scaled_dot_product_attention(q.transpose(0, 1), k[:n].transpose(0, 1), v[:n].transpose(0, 1),
                                          attn_mask=mask, scale=scale, enable_gqa=h != kvh).transpose(0, 1)


def _sdpa_decode(q, k, v, pos, scale):
    """Stock attention for N one-query sequences at once: q [N, H, D], k/v [N, S, KVH, D]."""
    s = int(pos.max()) + 1
    mask = (torch.arange(s, device=q.device)[None, :] <= pos[:, None])[:, None, None, :]
    return F.scaled_dot_product_attention(q[:, :, None, :], k[:, :s].transpose(1, 2), v[:, :s].transpose(1, 2),
                                          attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[2])[:, :, 0]


def kernels(device: torch.device, dtype: torch.dtype, shapes: dict, decode_rows=(1, 8), prefill: int = 512,
            ctx: int = 1024) -> dict:
    """Per model shape and phase: microseconds of each kernel, invariant and stock, and the
    forward pass's invariant_over_cublas."""
    from tttr.kernels import invariant
    from tttr.kernels import triton_kernels as tk

    if device.type == "cuda":  # as the engine calls them: invariant.py routes CUDA tensors to Triton
        linear, attention, decode = invariant.linear, invariant.attention, invariant.decode_attention
    else:  # CPU tensors would take the CPU kernels: call the Triton ones (interpreter) as invariant.py does
        linear, attention = tk.linear, tk.attention

        def decode(q, k, v, pos, scale):
            return torch.cat([tk.attention(q[i:i + 1], k[i], v[i], pos[i:i + 1], scale) for i in range(q.shape[0])])
    timer = _timer(device)
    g = torch.Generator(device="cpu").manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype)

    out: dict = {}
    for name, s in shapes.items():
        weights = {k: rnd(n, kk) / kk**0.5 for k, (n, kk) in s.products().items()}
        head = rnd(s.vocab, s.d) / s.d**0.5
        scale = s.head_dim**-0.5
        phases = {f"decode_{m}": m for m in decode_rows}
        phases[f"prefill_{prefill}"] = prefill
        res = {}
        for phase, rows in phases.items():
            ops_us: dict[str, dict[str, float]] = {}
            for key, w in weights.items():
                x = rnd(rows, w.shape[1])
                ops_us[key] = {"invariant": timer(lambda: linear(x, w)), "stock": timer(lambda: F.linear(x, w))}
            if phase.startswith("decode"):
                n_ctx = ctx
                q, k, v = rnd(rows, s.heads, s.head_dim), rnd(rows, n_ctx, s.kv_heads, s.head_dim), rnd(
                    rows, n_ctx, s.kv_heads, s.head_dim)
                pos = torch.full((rows,), n_ctx - 1, device=device)
                ops_us["attention"] = {"invariant": timer(lambda: decode(q, k, v, pos, scale)),
                                       "stock": timer(lambda: _sdpa_decode(q, k, v, pos, scale))}
                head_rows = rows
            else:
                q, k, v = rnd(rows, s.heads, s.head_dim), rnd(rows, s.kv_heads, s.head_dim), rnd(
                    rows, s.kv_heads, s.head_dim)
                pos = torch.arange(rows, device=device)
                ops_us["attention"] = {"invariant": timer(lambda: attention(q, k, v, pos, scale)),
                                       "stock": timer(lambda: _sdpa(q, k, v, pos, scale))}
                head_rows = 1
            xh = rnd(head_rows, s.d)
            ops_us["head"] = {"invariant": timer(lambda: linear(xh, head)), "stock": timer(lambda: F.linear(xh, head))}
            totals = {side: s.layers * sum(v[side] for k, v in ops_us.items() if k != "head") + ops_us["head"][side]
                      for side in ("invariant", "stock")}
            res[phase] = {"us": {k: {side: round(t, 1) for side, t in v.items()} for k, v in ops_us.items()},
                          "forward_us": {side: round(t, 1) for side, t in totals.items()},
                          "invariant_over_cublas": round(totals["stock"] / totals["invariant"], 3)}
        out[name] = res
    return out
