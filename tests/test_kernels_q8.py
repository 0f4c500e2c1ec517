"""The `invariant-q8` mode's block products (kernels.cq8): activations quantized to 8 bits as
ggml does it (checked against numpy written from ggml-quants.c), integer products exact
(checked against float64 of the dequantized values), the plain C and AVX2 bodies giving the
same bits, each row independent of the batch, its place in it and the thread count, and the
default model deterministic under the mode whatever shares its passes."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

from tttr.kernels import cq8, cquant, ops
from tttr.kernels.mode import MODES, Q8, is_invariant, kernel_mode
from tttr.sessions.cache import _cpu_flags, build_shared
from tests.kernel_helpers import assert_rows_invariant, compiled_bodies, greedy_among_others, random_weight

FORMATS = cquant.FORMATS  # Q4_1, Q8_0, Q4_K, Q5_0, Q5_K, Q6_K: one per layout and activation kind at least


def _weight(fmt: str, n: int, k: int, seed: int) -> tuple[np.ndarray, cquant.QuantWeight, np.ndarray]:
    """Random valid GGUF rows of `fmt`, packed, and gguf's values for them (float64)."""
    raw, values = random_weight(fmt, n, k, seed)
    return raw, cquant.pack(fmt, raw, n, k), values.astype(np.float64)


def _kind(fmt: str) -> str:
    return cq8.ACTIVATIONS[cq8.KIND_OF[fmt]]


def _ggml_quantize(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ggml's quantize_row_q8_0 / _q8_1 (AVX2 bodies) and quantize_row_q8_K_ref, in numpy fp32."""
    f32 = np.float32
    m, k = x.shape
    if kind == "Q8_K":
        blocks = x.reshape(m, k // 256, 256)
        big = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)  # the first of largest |x|
        with np.errstate(divide="ignore", invalid="ignore"):  # an all-zero block: its quants are set to 0 below
            iscale = (f32(-127.0) / big).astype(f32)
            q = np.minimum(127, np.rint((iscale * blocks).astype(f32))).astype(np.int8)
        d = np.where(big == 0, f32(0), (f32(1) / iscale).astype(f32)).astype(f32)  # [m, k/256, 1]
        q = np.where(big == 0, 0, q).astype(np.int8).reshape(m, k)
        d32 = np.repeat(d[..., 0], 8, axis=1)
        sums = q.reshape(m, k // 32, 32).astype(np.int64).sum(-1).astype(f32)
        return q, d32, (d32 * sums).astype(f32)
    blocks = x.reshape(m, k // 32, 32)
    amax = np.abs(blocks).max(-1, keepdims=True)
    d = (amax / f32(127)).astype(f32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, f32(127) / amax, f32(0)).astype(f32)
    q = np.rint((blocks * inv).astype(f32)).astype(np.int8)
    sums = q.astype(np.int64).sum(-1).astype(f32)
    s = (d[..., 0] * sums).astype(f32).astype(np.float16).astype(f32) if kind == "Q8_1" else np.zeros_like(sums)
    return q.reshape(m, k), d[..., 0].astype(np.float16).astype(f32), s


@pytest.mark.parametrize("kind", cq8.ACTIVATIONS)
def test_activations_are_quantized_as_ggml_does(kind):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((7, 512)) * rng.uniform(0.01, 30, (7, 1))).astype(np.float32)
    x[3, :256] = 0.0  # an all-zero block (and super-block): scale 0, quants 0
    x[4, 7] = -50.0  # a negative largest input: Q8_K's scale is negative then, its quants flip sign
    got = cq8.quantize(x, kind)
    want = _ggml_quantize(x, kind)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    assert np.abs(got[0]).max() == 127 and got[0].min() >= -127  # never -128: the sign trick stays exact


def _reference(x: torch.Tensor, fmt: str, raw: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float64 of (the dequantized weights) x (the quantized-then-dequantized activations), and
    the magnitude fp32 rounding scales with. Q4_1 with Q8_1 adds, as ggml does, each block's
    minimum times the block sum it kept in fp16, in place of the exact sum."""
    q, d, s = cq8.quantize(x.numpy(), _kind(fmt))
    m, k = q.shape
    xd = (q.reshape(m, k // 32, 32).astype(np.float64) * d[:, :, None]).reshape(m, k)
    out = xd @ values.T
    if fmt == "Q4_1":
        mins = raw.reshape(raw.shape[0], k // 32, 20)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        exact_sums = q.reshape(m, k // 32, 32).astype(np.float64).sum(-1) * d
        out += (s.astype(np.float64) - exact_sums) @ mins.T
    return out, np.abs(xd) @ np.abs(values).T


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_integer_products_are_exact(fmt):
    raw, qw, values = _weight(fmt, 48, 768, seed=11)
    x = torch.randn(9, 768)
    out = cq8.linear(x, qw)
    ref, magnitude = _reference(x, fmt, raw, values)
    assert out.dtype == torch.float32 and out.shape == (9, 48)
    # only the per-block float steps round: a few fp32 ulps of the magnitude
    assert (np.abs(out.numpy().astype(np.float64) - ref) <= 1e-6 * magnitude.max()).all()
    # and it is not the fp32 product: the activations' 8-bit rounding shows, at about 1/254
    fp32 = cquant.linear(x, qw).numpy().astype(np.float64)
    gap = np.abs(out.numpy() - fp32).max() / magnitude.max()
    assert 1e-6 < gap < 1e-2


def test_parts_of_different_types_each_get_their_own_activations():
    """A fused q/k/v of Q4_K (Q8_K activations), Q5_0 and Q4_1 (Q8_0/Q8_1) parts: each part's rows
    are what that part alone gives."""
    parts = [_weight(fmt, 32, 256, seed) for fmt, seed in (("Q4_K", 1), ("Q5_0", 2), ("Q4_1", 3))]
    qw = cquant.stack([p.parts[0] for _, p, _ in parts])
    x = torch.randn(5, 256)
    out = cq8.linear(x, qw)
    assert torch.equal(out, torch.cat([cq8.linear(x, p) for _, p, _ in parts], dim=1))


def _bodies() -> dict:
    """cq8's plain C, AVX2 and (where the CPU has AVX-512 VNNI and VBMI) AVX-512 bodies."""
    flags = _cpu_flags().split()
    libs = compiled_bodies(cq8, "q8linear", "tttr_q8_kernel",
                           avx512=all(f in flags for f in ("avx512bw", "avx512_vnni", "avx512vbmi")))
    assert len(libs) >= 2, "this machine has AVX2: at least two bodies must be built and compared"
    return libs


def _same_bits_in_every_body(libs, qw, x: torch.Tensor, threads: int = 2) -> torch.Tensor:
    outs = {}
    for name, lib in libs.items():
        out = torch.full((x.shape[0], qw.shape[0]), float("nan"))
        assert lib.tttr_q8_linear_parts(*cq8._call(qw), qw.shape[1], x.data_ptr(), x.shape[0], out.data_ptr(),
                                        threads) == 0
        outs[name] = out
    first = outs["c"]
    for name, out in outs.items():
        assert torch.equal(out.view(torch.int32), first.view(torch.int32)), f"{qw.fmt}: {name} and c disagree"
    return first


def test_the_plain_c_avx2_and_avx512_bodies_give_the_same_bits():
    libs = _bodies()
    for fmt in FORMATS:
        _, qw, _ = _weight(fmt, 64, 512, seed=2)
        _same_bits_in_every_body(libs, qw, torch.randn(11, 512) * 3)
    # a fused weight of every layout at once, and rows that reach the quants' ends (+-127, 0)
    qw = cquant.stack([_weight(fmt, 32, 512, seed)[1].parts[0] for seed, fmt in enumerate(FORMATS)])
    x = torch.randn(9, 512)
    x[1] = 0.0
    x[2, ::2] = 5.0
    x[3] = -x[2]
    _same_bits_in_every_body(libs, qw, x)


@pytest.mark.parametrize("fmt,k", [("Q4_K", 2048), ("Q6_K", 2048), ("Q6_K", 8192), ("Q4_K", 8192)])
def test_k_quants_at_llama_1b_inputs_agree_in_every_body_batch_and_thread_count(fmt, k):
    """llama-1b's products (Q4_K and Q6_K over 2,048 and 8,192 inputs) at 1-9 rows: the same bits
    from every body, whatever the batch, the row's place and the threads; 9 rows cross the
    AVX-512 body's 8-row step."""
    libs = _bodies()
    _, qw, _ = _weight(fmt, 48, k, seed=k + len(fmt))
    x = torch.randn(9, k) * 2
    full = _same_bits_in_every_body(libs, qw, x)
    for rows in (1, 2, 5, 8):
        for threads in (1, 3):
            assert torch.equal(_same_bits_in_every_body(libs, qw, x[-rows:].contiguous(), threads), full[-rows:])
    assert torch.equal(cq8.linear(x, qw), full)


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_do_not_depend_on_the_batch_their_place_or_threads(fmt):
    _, qw, _ = _weight(fmt, 64, 512, seed=12)
    assert_rows_invariant(lambda x: cq8.linear(x, qw), torch.randn(17, 512))


def test_the_mode_routes_block_products_only_and_counts_as_invariant():
    assert Q8 in MODES and is_invariant(Q8) and is_invariant("invariant") and not is_invariant("fast")
    _, qw, values = _weight("Q4_1", 32, 256, seed=4)
    x = torch.randn(3, 256)
    dense = torch.from_numpy(values.astype(np.float32))
    with kernel_mode(Q8):
        assert torch.equal(ops.linear(x, qw), cq8.linear(x, qw))
        # a dense fp32 weight multiplies as `invariant` multiplies it
        with kernel_mode("invariant"):
            expected = ops.linear(x, dense)
        assert torch.equal(ops.linear(x, dense), expected)
    with kernel_mode("invariant"):
        assert torch.equal(ops.linear(x, qw), cquant.linear(x, qw))
    assert ops.describe()["q8_kernel"] == f"q8:{cq8.kernel_name()}"


# ---- the default model ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model():
    from tttr.engine.inference.model import load_model

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_model()
    torch.set_num_threads(before)


@pytest.mark.slow  # the default model generating in several batch compositions
def test_default_model_greedy_is_the_same_in_any_batch(model):
    from tttr.engine.inference.sampler import SamplingParams
    from tttr.engine.inference.scheduler import Engine
    from tttr.engine.inference.sequence import Sequence

    tok = model.tokenizer
    target = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    results, layouts = greedy_among_others(model, Q8, target, ((0, 0, 1), (3, 0, 1), (5, 5, 2), (9, 4, 1)), seed=3)
    fp32 = Sequence(target, SamplingParams(), 6, stop_token_ids=())
    with Engine(model, kernel_mode="invariant") as eng:
        eng.generate([fp32])
    assert len(layouts) == 4 and len(results) == 1
    # other arithmetic: no logits digest in common with the fp32 mode's
    assert not {r.digest for r in fp32.records} & {d for _, d in next(iter(results))}


@pytest.mark.slow  # the default model, and llama.cpp in a process of its own
def test_default_model_greedy_matches_llama_cpp_where_fp32_parts_from_it(model):
    """On "What is the capital of France?" the fp32 modes' first token is a near-tie (0.08 apart)
    that llama.cpp's 8-bit activations decide the other way; with the same activations,
    TTTR's 30 greedy tokens are llama.cpp's."""
    import json
    import subprocess
    import sys

    from tttr.engine.inference import llama_cpp_reference as lcpp
    from tttr.engine.inference.sampler import SamplingParams
    from tttr.engine.inference.scheduler import Engine
    from tttr.engine.inference.sequence import Sequence

    tok = model.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
    done = subprocess.run([sys.executable, "-m", lcpp.MODULE, "generate", str(model.path), "30",
                           "--ids", ",".join(map(str, ids)), "--rounds", "1", "--threads", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout)["ids"]
    ours = {}
    for mode in ("invariant", Q8):
        s = Sequence(ids, SamplingParams(temperature=0.0), 30, stop_token_ids=())
        with Engine(model, kernel_mode=mode) as eng:
            eng.generate([s])
        ours[mode] = s.output_ids
    assert ours[Q8] == theirs
    assert ours["invariant"][0] != theirs[0]  # the near-tie this test is about is still there


def test_called_by_every_thread_of_an_open_region_it_gives_the_same_bits():
    """What the compiled decode step does under `invariant-q8` (it calls cquant's products the same way, with the
    same arguments): the team shares the groups, each thread quantizing the rows for itself."""
    wrapper = r"""
int test_in_region(int nparts, const int *formats, const uint8_t *const *ws, const int64_t *ns, int64_t K,
                   const float *x, int64_t M, float *out, int threads) {
    int rc = 0;
    #pragma omp parallel num_threads(threads)
    {
        const int r = tttr_q8_linear_parts(nparts, formats, ws, ns, K, x, M, out, 1);
        #pragma omp critical
        rc |= r;
    }
    return rc;
}
"""
    path, why = build_shared("q8linear-test-region", cq8.SOURCE + wrapper, cq8._FLAGS, "a test build", subdir="kernels")
    assert path is not None, why
    lib = ctypes.CDLL(str(path))
    lib.test_in_region.argtypes = cq8.load().tttr_q8_linear_parts.argtypes
    qw = cquant.stack([_weight(fmt, 48, 512, seed)[1].parts[0] for fmt, seed in (("Q4_1", 6), ("Q6_K", 7))])
    x = torch.randn(5, 512)
    want = cq8.linear(x, qw)
    for threads in (1, 2, 3):
        out = torch.full_like(want, float("nan"))
        assert lib.test_in_region(*cq8._call(qw), 512, x.data_ptr(), 5, out.data_ptr(), threads) == 0
        assert torch.equal(out, want)
