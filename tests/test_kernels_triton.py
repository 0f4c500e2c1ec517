"""The Triton kernels under the interpreter (TRITON_INTERPRET=1, CPU tensors, fp32, small
shapes): allclose to the CPU invariant ops, and bitwise invariant over batch sizes,
positions and chunkings. The interpreter flag must be set before triton is imported, so
the checks run in a child interpreter (this file, run as a script)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the Triton kernels under the interpreter

ROOT = Path(__file__).resolve().parent.parent


def _child() -> None:
    import torch

    from tttr.kernels import invariant as inv
    from tttr.kernels import triton_kernels as tk

    # Small splits so that a few dozen keys already span several of them.
    tk.KV_BLOCK = 16
    tk.KV_SPLIT = 16
    g = torch.Generator().manual_seed(0)

    # matmul: tiles of 32 rows; 40 rows span two row tiles, 96 outputs two column tiles.
    w = torch.randn(96, 80, generator=g)
    b = torch.randn(96, generator=g)
    x = torch.randn(40, 80, generator=g)
    full = tk.linear(x, w, b)
    assert torch.allclose(full, inv.linear(x, w, b), atol=1e-4, rtol=1e-4), "matmul vs invariant"
    for m in (1, 2, 3, 8, 31, 32, 33):
        assert torch.equal(tk.linear(x[:m], w, b), full[:m]), f"matmul rows differ in a {m}-row call"
    assert torch.equal(tk.linear(x[33:36], w, b), full[33:36]), "matmul row position"
    assert torch.equal(tk.linear(x.flip(0), w, b), full.flip(0)), "matmul row order"
    print("matmul ok")

    xn = torch.randn(12, 1100, generator=g) * 3  # longer than one row block
    wn = torch.randn(1100, generator=g)
    r = tk.rms_norm(xn, wn, 1e-5)
    assert torch.allclose(r, inv.rms_norm(xn, wn, 1e-5), atol=1e-5, rtol=1e-4), "rms_norm vs invariant"
    ls = tk.log_softmax(xn)
    assert torch.allclose(ls, inv.log_softmax(xn), atol=1e-5, rtol=1e-4), "log_softmax vs invariant"
    sm = tk.softmax(xn)
    assert torch.allclose(sm, inv.softmax(xn), atol=1e-6, rtol=1e-4), "softmax vs invariant"
    for m in (1, 2, 5):
        assert torch.equal(tk.rms_norm(xn[:m], wn, 1e-5), r[:m]), "rms_norm batch"
        assert torch.equal(tk.log_softmax(xn[:m]), ls[:m]), "log_softmax batch"
    assert torch.equal(tk.log_softmax(xn[7:8]), ls[7:8]), "log_softmax position"
    print("row kernels ok")

    s, h, kvh, d = 40, 4, 2, 16
    q = torch.randn(s, h, d, generator=g)
    k = torch.randn(s, kvh, d, generator=g)
    v = torch.randn(s, kvh, d, generator=g)
    pos = torch.arange(s)
    full = tk.attention(q, k, v, pos, 0.25)
    assert torch.allclose(full, inv.attention(q, k, v, pos, 0.25), atol=1e-5), "attention vs invariant"
    chunked = torch.cat([tk.attention(q[a:a + 13], k[:a + 13], v[:a + 13], pos[a:a + 13], 0.25)
                         for a in range(0, s, 13)])
    assert torch.equal(chunked, full), "attention: chunked prefill differs from one prefill"
    kc = torch.zeros(s, kvh, d)
    vc = torch.zeros(s, kvh, d)
    kc[:35], vc[:35] = k[:35], v[:35]
    for t in range(35, s):  # token by token, each writing its K/V first
        out = tk.decode_attention(q[t:t + 1], kc, vc, k[t:t + 1], v[t:t + 1], pos[t:t + 1], 0.25)
        assert torch.equal(out, full[t:t + 1]), f"attention: decode at {t} differs from prefill"
    assert torch.equal(kc, k) and torch.equal(vc, v), "KV write"
    print("attention ok")


def test_triton_kernels_under_interpreter():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, __file__, "child"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == ["matmul", "ok", "row", "kernels", "ok", "attention", "ok"]


if __name__ == "__main__" and sys.argv[1:] == ["child"]:
    _child()
