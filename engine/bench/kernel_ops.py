"""The per-op half of `tttr bench kernels`: invariant against fast, side by side in one run.

Each op at the default model's decode and prefill shapes; every figure alternates the two
modes round by round and keeps each mode's best round, so load from other processes on a
shared machine hits both alike. Ratios are invariant time / fast time (lower is better; the
target is <= 1.15). The end-to-end half needs a model: kernels.py."""

from __future__ import annotations

import time
from typing import Callable

import torch

from tttr.kernels import ops
from tttr.kernels.mode import BASE_MODES as MODES, kernel_mode  # the fp32 pair; invariant-q8: its own tests

D, FFN, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 49152, 9, 3, 64
LINEARS = {"qkv": (HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM, D), "o": (D, D), "gate_up": (2 * FFN, D),
           "down": (D, FFN), "lm_head": (VOCAB, D)}
DECODE_ROWS = (1, 8)
PREFILL_ROWS = 256
ATTN_CTX = 256


def _best_of(fns: dict[str, Callable[[], object]], rounds: int, inner: int) -> dict[str, float]:
    """Seconds per call of each fn, best round, rounds alternating between the fns."""
    best = {k: float("inf") for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            t = time.perf_counter()
            for _ in range(inner):
                fn()
            best[k] = min(best[k], (time.perf_counter() - t) / inner)
    return best


def _mode_fns(make: Callable[[], Callable[[], object]]) -> dict[str, Callable[[], object]]:
    def bound(mode):
        fn = make()

        def run():
            with kernel_mode(mode):
                return fn()

        return run

    return {m: bound(m) for m in MODES}


def op_timings(rounds: int = 5, progress: Callable[[int, int, str], None] | None = None) -> dict:
    g = torch.Generator().manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, generator=g)

    cases: list[tuple[str, Callable[[], Callable[[], object]], int]] = []
    for name, (n, k) in LINEARS.items():
        w = rnd(n, k) / k**0.5
        for rows in (*DECODE_ROWS, PREFILL_ROWS):
            if name == "lm_head" and rows == PREFILL_ROWS:
                continue  # the engine takes logits of the produced positions only
            x = rnd(rows, k)
            cases.append((f"linear {name} {n}x{k} rows={rows}", lambda x=x, w=w: (lambda: ops.linear(x, w)),
                          20 if rows < 64 and n < 10000 else 3))
    wn = rnd(D)
    for rows in (*DECODE_ROWS, PREFILL_ROWS):
        x = rnd(rows, D)
        cases.append((f"rms_norm {D} rows={rows}", lambda x=x: (lambda: ops.rms_norm(x, wn, 1e-5)), 50))
    for rows in DECODE_ROWS:
        z = rnd(rows, VOCAB)
        cases.append((f"log_softmax {VOCAB} rows={rows}", lambda z=z: (lambda: ops.log_softmax(z, -1)), 10))
    k, v = rnd(ATTN_CTX, KV_HEADS, HEAD_DIM), rnd(ATTN_CTX, KV_HEADS, HEAD_DIM)
    q1, p1 = rnd(1, HEADS, HEAD_DIM), torch.tensor([ATTN_CTX - 1])
    qp, pp = rnd(ATTN_CTX, HEADS, HEAD_DIM), torch.arange(ATTN_CTX)
    cases.append((f"attention decode ctx={ATTN_CTX}", lambda: (lambda: ops.attention(q1, k, v, p1, 0.125)), 20))
    cases.append((f"attention prefill {ATTN_CTX}", lambda: (lambda: ops.attention(qp, k, v, pp, 0.125)), 2))
    out = {}
    for i, (name, make, inner) in enumerate(cases):
        t = _best_of(_mode_fns(make), rounds, inner)
        out[name] = {"fast_us": t["fast"] * 1e6, "invariant_us": t["invariant"] * 1e6,
                     "ratio": t["invariant"] / t["fast"]}
        if progress:
            progress(i + 1, len(cases), "ops")
    return out
