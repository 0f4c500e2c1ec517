"""Batch invariance of the CPU kernels, bit for bit: op(x[:1]) == op(x)[:1] over row
counts, row positions, neighbours, chunkings and thread counts. MKL's invariance is an
observation, so every shape of the default model is checked here, not assumed."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tttr.kernels import cattention
from tttr.kernels import invariant as inv
from tttr.kernels import packing
from tttr.kernels import ops
from tttr.kernels.mode import kernel_mode

# The default model (SmolLM2-135M): d=576, fused QKV 576+2*192, o 576, fused gate/up 2*1536,
# down 1536->576, tied head 49152.
MODEL_LINEARS = [(960, 576), (576, 576), (3072, 576), (1536, 576), (576, 1536), (49152, 576)]
ROW_COUNTS = [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 128, 255, 256]


def _weights(n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) / k**0.5


def _rows(m, k, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g)


@pytest.mark.parametrize("n,k", MODEL_LINEARS)
def test_linear_row_independent_of_row_count_and_position(n, k):
    w = _weights(n, k)
    x = _rows(256, k)
    full = inv.linear(x, w)
    assert torch.allclose(full, F.linear(x, w), atol=1e-4, rtol=1e-4)
    counts = ROW_COUNTS if n < 10000 else [1, 2, 3, 8, 9, 64, 256]
    for m in counts:
        assert torch.equal(inv.linear(x[:m], w), full[:m]), f"{n}x{k}: rows differ in a {m}-row call"
    # the same row at another position, among other neighbours
    perm = torch.randperm(256, generator=torch.Generator().manual_seed(2))
    assert torch.equal(inv.linear(x[perm], w), full[perm])
    assert torch.equal(inv.linear(x[37:40], w), full[37:40])


def test_linear_is_invariant_where_stock_varies_here():
    # What the invariant path fixes: stock fp32 F.linear gives a 1-row product other bits.
    w, x = _weights(576, 576), _rows(8, 576)
    differs = [m for m in (2, 4, 8) if not torch.equal(F.linear(x[:1], w), F.linear(x[:m], w)[:1])]
    if not differs:
        pytest.skip("stock GEMM happens to be batch-invariant on this machine")
    for m in differs:
        assert torch.equal(inv.linear(x[:1], w), inv.linear(x[:m], w)[:1]), m


def test_linear_beyond_max_rows_and_leading_dims():
    w = _weights(576, 576)
    x = _rows(600, 576)
    full = inv.linear(x, w)
    assert torch.equal(inv.linear(x[:1], w), full[:1])
    assert torch.equal(inv.linear(x[590:], w), full[590:])
    assert torch.equal(inv.linear(x.reshape(2, 300, 576), w).reshape(600, 576), full)


@pytest.mark.parametrize("n,k", [(100, 37), (64, 8), (50, 300), (7, 5)])
def test_linear_small_and_odd_shapes_fall_back_invariantly(n, k):
    w = _weights(n, k)
    x = _rows(40, k)
    b = torch.randn(n)
    full = inv.linear(x, w, b)
    assert torch.allclose(full, F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    for m in (1, 2, 3, 8, 9, 17):
        assert torch.equal(inv.linear(x[:m], w, b), full[:m])
    # the last resort, whichever path the probe picked here: exact products, fixed-order sums
    exact = inv._linear_exact(x, w)
    assert torch.allclose(exact, F.linear(x, w), atol=1e-4, rtol=1e-4)
    for m in (1, 2, 3, 8, 9, 17):
        assert torch.equal(inv._linear_exact(x[:m], w), exact[:m])
    assert torch.equal(inv._linear_exact(x[20:23], w), exact[20:23])


def test_linear_model_shapes_take_mkl_wherever_it_is_invariant_here():
    """MKL picks its kernels by CPU and shape: on the Intel machines measured so far its packed
    GEMM kept a row's bits for every row count at the model's shapes, on an AMD EPYC (AVX2
    build) it did not. The fast path must be taken exactly where MKL is invariant on this
    machine (judged here by a probe of our own), and whichever path is taken must be."""
    for n, k in MODEL_LINEARS[:-1]:
        w = _weights(n, k)
        x = _rows(17, k)
        path = inv.linear_path(w)
        if packing.HAS_MKL_PACK:
            pk = packing.packed(w)
            full = packing.mkl_linear(x, w, pk)
            mkl_invariant = all(torch.equal(packing.mkl_linear(x[:m].contiguous(), w, pk), full[:m])
                                for m in range(1, 18))
            assert (path == "mkl") == mkl_invariant, (n, k, path, mkl_invariant)
        else:
            assert path != "mkl"
        full = inv.linear(x, w)
        for m in range(1, 18):
            assert torch.equal(inv.linear(x[:m].contiguous(), w), full[:m]), (n, k, path, m)


def test_linear_repacks_after_in_place_update():
    w = _weights(576, 576)
    x = _rows(3, 576)
    before = inv.linear(x, w)
    w.mul_(2)
    after = inv.linear(x, w)
    assert torch.allclose(after, F.linear(x, w), atol=1e-4)
    assert torch.equal(after, before * 2)  # doubling is exact: same path, new values


@pytest.mark.parametrize("threads", [1, 3, 4])
def test_linear_and_norms_independent_of_thread_count(threads):
    before = torch.get_num_threads()
    shapes = [(960, 576), (3072, 576), (576, 1536)]
    ws = [_weights(n, k) for n, k in shapes]
    xs = [_rows(64, k) for _, k in shapes]
    z = _rows(16, 49152)
    ref = [inv.linear(x, w) for x, w in zip(xs, ws)] + [inv.log_softmax(z), inv.rms_norm(xs[0], torch.ones(576), 1e-5)]
    try:
        torch.set_num_threads(threads)
        got = [inv.linear(x, w) for x, w in zip(xs, ws)] + [inv.log_softmax(z), inv.rms_norm(xs[0], torch.ones(576), 1e-5)]
    finally:
        torch.set_num_threads(before)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)


def _stock_rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("d", [576, 1536, 49152, 100, 65])
def test_row_ops_independent_of_row_count(d):
    x = _rows(260, d) * 3
    w = torch.randn(d)
    cases = [
        (lambda t: inv.rms_norm(t, w, 1e-5), lambda t: _stock_rms(t, w, 1e-5)),
        (lambda t: inv.log_softmax(t, -1), lambda t: torch.log_softmax(t, -1)),
        (lambda t: inv.softmax(t, -1), lambda t: torch.softmax(t, -1)),
    ]
    for op, ref in cases:
        full = op(x)
        assert torch.allclose(full, ref(x), atol=1e-5, rtol=1e-4)
        for m in (1, 2, 3, 8, 33, 256):
            assert torch.equal(op(x[:m]), full[:m])
        assert torch.equal(op(x[100:101]), full[100:101])


def test_softmax_other_dim():
    x = _rows(30, 7)
    assert torch.allclose(inv.softmax(x, 0), torch.softmax(x, 0), atol=1e-6)
    assert torch.allclose(inv.log_softmax(x, 0), torch.log_softmax(x, 0), atol=1e-5)
    assert torch.equal(inv.softmax(x[:, :1], 0), inv.softmax(x, 0)[:, :1])


H, KVH, HD = 9, 3, 64


@pytest.fixture(params=["compiled", "blocked", "blocked-exact"])
def attention_kernel(request, monkeypatch):
    """Both CPU attention kernels must keep every property: the compiled loop nest (the
    default where a C compiler exists) and the blocked PyTorch formulation (the fallback),
    with either of its GEMM paths (the one its probe picks here, and the exact last resort)."""
    if request.param.startswith("blocked"):
        monkeypatch.setattr(inv, "_compiled", lambda: None)
        if request.param == "blocked-exact":
            monkeypatch.setattr(inv, "attention_gemm", lambda k, n: "exact")
    elif inv.attention_kernel() != "compiled":
        pytest.fail(f"the compiled attention did not build here: {cattention.why_unavailable()}")
    return request.param


_FIXTURE_OK = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _qkv(s, seed=3):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(s, H, HD, generator=g), torch.randn(s, KVH, HD, generator=g),
            torch.randn(s, KVH, HD, generator=g))


def test_attention_matches_stock(attention_kernel):
    q, k, v = _qkv(150)
    pos = torch.arange(150)
    got = inv.attention(q, k, v, pos, 0.125)
    with kernel_mode("fast"):
        ref = ops.attention(q, k, v, pos, 0.125)
    assert torch.allclose(got, ref, atol=1e-5)


@_FIXTURE_OK
@given(st.lists(st.integers(1, 40), min_size=1, max_size=8), st.integers(1, 200))
def test_attention_same_for_any_chunking(attention_kernel, chunks, extra):
    s = 70 + extra % 130
    q, k, v = _qkv(s)
    pos = torch.arange(s)
    full = inv.attention(q, k, v, pos, 0.125)
    out, start, i = [], 0, 0
    while start < s:
        c = chunks[i % len(chunks)]
        end = min(s, start + c)
        # the cache the call sees holds exactly keys 0..end-1 (or more: a larger cache)
        out.append(inv.attention(q[start:end], k[: end + (i % 2) * 5], v[: end + (i % 2) * 5], pos[start:end], 0.125))
        start, i = end, i + 1
    assert torch.equal(torch.cat(out), full)


def test_attention_token_by_token_equals_prefill(attention_kernel):
    q, k, v = _qkv(140)
    pos = torch.arange(140)
    full = inv.attention(q, k, v, pos, 0.125)
    for t in (0, 1, 63, 64, 65, 127, 128, 139):
        assert torch.equal(inv.attention(q[t : t + 1], k[: t + 1], v[: t + 1], pos[t : t + 1], 0.125), full[t : t + 1])


def test_attention_long_prefill_chunks_internally(attention_kernel):
    q, k, v = _qkv(700)
    pos = torch.arange(700)
    full = inv.attention(q, k, v, pos, 0.125)
    assert torch.equal(inv.attention(q[650:], k, v, pos[650:], 0.125), full[650:])


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 64), st.integers(0, 63), st.integers(0, 10_000))
def test_linear_property_any_rows_any_position(m, where, seed):
    w = _weights(960, 576)
    g = torch.Generator().manual_seed(seed)
    mine = torch.randn(1, 576, generator=g)
    alone = inv.linear(mine, w)
    others = torch.randn(m, 576, generator=g) * (1 + seed % 7)
    at = where % (m + 1)
    batch = torch.cat([others[:at], mine, others[at:]])
    assert torch.equal(inv.linear(batch, w)[at : at + 1], alone)


def test_ops_dispatch_on_mode():
    w, x = _weights(576, 576), _rows(3, 576)
    with kernel_mode("invariant"):
        assert torch.equal(ops.linear(x, w), inv.linear(x, w))
    with kernel_mode("fast"):
        # fast: MKL's packed GEMM at decode sizes (the weight packed once), stock beyond
        assert torch.allclose(ops.linear(x, w), F.linear(x, w), atol=1e-5, rtol=1e-5)
        if packing.HAS_MKL_PACK:
            assert torch.equal(ops.linear(x, w), packing.mkl_linear(x, w, packing.packed(w)))
        big = _rows(300, 576)
        assert torch.equal(ops.linear(big, w), F.linear(big, w))
        b = torch.randn(576)
        assert torch.allclose(ops.linear(x, w, b), F.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_bf16_inputs_compute_in_fp32():
    w = _weights(576, 576).to(torch.bfloat16)
    x = _rows(9, 576).to(torch.bfloat16)
    full = inv.linear(x, w)
    assert full.dtype == torch.bfloat16
    # the product of the same values in fp32, rounded to bf16 once at the end
    assert torch.equal(full, inv.linear(x.float(), w.float()).to(torch.bfloat16))
    assert torch.equal(inv.linear(x[:1], w), full[:1])


def test_silu_mul_is_invariant_across_row_lengths_and_offsets():
    """The SwiGLU product gives each element the same bits whether it sits in the vector
    body or the scalar tail of a row (stock sigmoid does not, here)."""
    g = torch.randn(1, 1536 + 31, generator=torch.Generator().manual_seed(5))
    u = torch.randn_like(g)
    with kernel_mode("invariant"):
        full = ops.silu_mul(g, u)
        for cut in (1, 7, 31, 63, 1000):
            part = ops.silu_mul(g[:, cut:], u[:, cut:])
            assert torch.equal(part, full[:, cut:])
    assert torch.allclose(full, torch.nn.functional.silu(g) * u, atol=1e-6)


def _padded(ks, vs, positions, extra=0):
    """The keys/values of several sequences as one zero-padded batch [N, S, KVH, D], the
    layout of the engine's KV pool (rows past a sequence's position are zero)."""
    s = max(positions) + 1 + extra
    kb, vb = torch.zeros(len(ks), s, KVH, HD), torch.zeros(len(ks), s, KVH, HD)
    for i, (k, v, p) in enumerate(zip(ks, vs, positions)):
        kb[i, : p + 1], vb[i, : p + 1] = k[: p + 1], v[: p + 1]
    return kb, vb


@_FIXTURE_OK
@given(st.lists(st.integers(0, 300), min_size=1, max_size=9), st.integers(0, 10_000))
def test_decode_attention_rows_equal_single_sequence_and_prefill(attention_kernel, positions, seed):
    """Batched decode: row i is bit for bit the single-sequence call and that query's row in
    a full prefill, whatever the other sequences (lengths, order) and however far the padded
    batch runs past the longest sequence."""
    g = torch.Generator().manual_seed(seed)
    n = len(positions)
    q = torch.randn(n, H, HD, generator=g)
    ks = [torch.randn(p + 1 + seed % 7, KVH, HD, generator=g) for p in positions]
    vs = [torch.randn(k.shape[0], KVH, HD, generator=g) for k in ks]
    for k, v, p in zip(ks, vs, positions):
        k[p + 1 :] = float("nan")  # stale cache rows must not leak into the single-sequence call
        v[p + 1 :] = float("nan")
    kb, vb = _padded(ks, vs, positions, extra=seed % 130)
    batch = inv.decode_attention(q, kb, vb, positions, 0.125)
    rev = inv.decode_attention(q.flip(0), kb.flip(0), vb.flip(0), positions[::-1], 0.125).flip(0)
    assert torch.equal(rev, batch)
    with kernel_mode("invariant"):
        assert torch.equal(ops.decode_attention(q, kb, vb, torch.tensor(positions), 0.125), batch)
    for i, p in enumerate(positions[:3]):
        alone = inv.attention(q[i : i + 1], ks[i], vs[i], torch.tensor([p]), 0.125)
        assert torch.equal(batch[i : i + 1], alone)
        pq = torch.randn(p + 1, H, HD, generator=g)
        pq[p] = q[i]
        prefill = inv.attention(pq, ks[i][: p + 1], vs[i][: p + 1], torch.arange(p + 1), 0.125)
        assert torch.equal(batch[i : i + 1], prefill[p : p + 1])


def test_decode_attention_fast_mode_matches_per_sequence():
    q, k, v = _qkv(90)
    pos = [89, 49, 4]
    kb, vb = _padded([k, k, k], [v, v, v], pos, extra=40)
    with kernel_mode("fast"):
        got = ops.decode_attention(q[:3], kb, vb, pos, 0.125)
        for i, p in enumerate(pos):
            alone = ops.attention(q[i : i + 1], k[: p + 1], v[: p + 1], torch.tensor([p]), 0.125)
            assert torch.allclose(got[i : i + 1], alone, atol=1e-6)


def test_compiled_attention_builds_where_a_compiler_exists_and_agrees_with_blocked(monkeypatch):
    import shutil

    has_cc = any(shutil.which(c) for c in ("gcc", "cc"))
    assert inv.attention_kernel() == ("compiled" if has_cc else "blocked"), cattention.why_unavailable()
    if not has_cc:
        return
    q, k, v = _qkv(300, seed=11)
    pos = torch.arange(300)
    compiled = inv.attention(q, k, v, pos, 0.125)
    monkeypatch.setattr(inv, "_compiled", lambda: None)
    blocked = inv.attention(q, k, v, pos, 0.125)
    assert torch.allclose(compiled, blocked, atol=2e-6, rtol=1e-5)


def test_compiled_attention_can_be_switched_off():
    import subprocess
    import sys

    code = "from tttr.kernels import invariant as inv; print(inv.attention_kernel())"
    env = {**__import__("os").environ, "TTTR_NO_C_KERNELS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "blocked"


def test_compiled_attention_refuses_out_of_range_reads():
    if not cattention.available():
        pytest.fail(f"the compiled attention did not build here: {cattention.why_unavailable()}")
    q, k, v = _qkv(10)
    with pytest.raises(ValueError, match="past the 10 keys"):
        cattention.attention(q[:1], k[None], v[None], torch.tensor([0]), torch.tensor([10]), 0.125)
    with pytest.raises(ValueError, match="sequence index"):
        cattention.attention(q[:1], k[None], v[None], torch.tensor([1]), torch.tensor([3]), 0.125)
