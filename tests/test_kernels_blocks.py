"""Products straight from GGUF blocks (kernels.cquant) and the compiled row-local steps
(kernels.crow): close to the dense fp32 arithmetic, batch-invariant bit for bit, the same bits
from every instruction-set body, and wired into the model for a quantized GGUF file."""

from __future__ import annotations

import ctypes

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tttr.kernels import cquant, crow, ops
from tttr.sessions.cache import build_shared, _cpu_flags
from tests.engine_tiny import tiny_config, tiny_weights, write_gguf
from tests.kernel_helpers import assert_rows_invariant, compiled_bodies, dense_copy

FORMATS = ("Q4_1", "Q8_0")  # the types gguf can quantize; the K-quants and Q5_0: test_kernels_kquants.py


def _quantized(fmt: str, n: int, k: int, seed: int = 0) -> tuple[cquant.QuantWeight, torch.Tensor]:
    """A random weight quantized by gguf, packed; and its dequantized fp32 values."""
    rng = np.random.default_rng(seed)
    dense = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[fmt]
    raw = gguf.quants.quantize(dense, qtype)
    values = torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).copy())
    return cquant.pack(fmt, raw, n, k), values


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
def test_block_product_is_the_dense_product_of_the_same_values(fmt, rows):
    qw, values = _quantized(fmt, 48, 96)
    x = torch.randn(rows, 96)
    out = cquant.linear(x, qw)
    exact = x.double() @ values.double().T
    assert out.dtype == torch.float32 and out.shape == (rows, 48)
    # fp32 arithmetic on the very values: only the summation order differs from F.linear
    assert (out.double() - exact).abs().max() < 1e-5
    assert (F.linear(x, values).double() - exact).abs().max() < 1e-5


@pytest.mark.parametrize("fmt", FORMATS)
def test_block_product_rows_do_not_depend_on_the_batch_or_threads(fmt):
    qw, _ = _quantized(fmt, 64, 128, seed=1)
    assert_rows_invariant(lambda x: cquant.linear(x, qw), torch.randn(17, 128))


def each_body(qw: cquant.QuantWeight, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """x @ qw^T from each instruction-set body of cquant.SOURCE this CPU can run."""
    outs = {}
    for name, lib in compiled_bodies(cquant, "qlinear", "tttr_qlinear_kernel").items():
        out = torch.empty(x.shape[0], qw.shape[0])
        assert lib.tttr_qlinear_parts(*qw._call, qw.shape[1], x.data_ptr(), x.shape[0], out.data_ptr(), 2) == 0
        outs[name] = out
    return outs


def test_every_instruction_set_body_gives_the_same_bits():
    for fmt in FORMATS:
        qw, _ = _quantized(fmt, 32, 64, seed=2)
        outs = list(each_body(qw, torch.randn(11, 64)).values())
        assert len(outs) >= 2 and all(torch.equal(o, outs[0]) for o in outs[1:]), f"{fmt}: bodies disagree"


def test_pack_refuses_shapes_it_cannot_hold():
    with pytest.raises(ValueError, match="cannot pack"):
        cquant.pack("Q4_1", np.zeros((10, 40), np.uint8), 10, 64)  # 10 rows: not a multiple of 16
    assert not cquant.supports("IQ4_XS", 16, 256) and not cquant.supports("Q4_K", 16, 96)
    with pytest.raises(ValueError, match="cannot pack"):
        cquant.pack("Q4_K", np.zeros((16, 144), np.uint8), 16, 128)  # 128 inputs: not a 256-input super-block


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_block_weight_expands_to_ggufs_dequantization(fmt):
    """The rows a block weight gives (the embedding lookup, or a dense product asked of it)
    are gguf's dequantized values bit for bit, for any rows in any order."""
    rng = np.random.default_rng(3)
    dense = (rng.standard_normal((48, 96)) * 0.1).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[fmt]
    raw = gguf.quants.quantize(dense, qtype)
    values = torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32).copy())
    qw = ops.block_weight(fmt, raw)
    assert isinstance(qw, cquant.QuantWeight) and qw.fmt == fmt and qw.shape == (48, 96)
    assert torch.equal(ops.dense(qw), values)
    ids = torch.tensor([47, 0, 17, 17, 31, 16, 15])
    assert torch.equal(ops.embedding(qw, ids), values.index_select(0, ids))
    assert torch.equal(ops.embedding(values, ids), values.index_select(0, ids))
    x = torch.randn(3, 96)
    assert torch.equal(ops.linear(x, qw), cquant.linear(x, qw))  # the product ran from the blocks
    assert (ops.linear(x, qw) - x @ values.T).abs().max() < 1e-5
    assert ops.block_weight(fmt, raw[:40]) is None  # 40 rows do not fill groups of 16: the caller stays dense


def _fp32_bytes(model) -> int:
    """Bytes of the fp32 tensors the model holds as weights."""
    held = [model.embed, model.norm] + ([] if model.lm_head is model.embed else [model.lm_head])
    held += [w for layer in model.layers for w in layer]
    return sum(w.nbytes for w in held if isinstance(w, torch.Tensor))


def test_a_quantized_gguf_runs_from_its_blocks_with_the_dense_logits(tmp_path):
    """The loader keeps the raw blocks, permuted like the fp32 rows (llama's Q/K), and the
    model's products run from them: logits as the dense product's, to fp32 rounding."""
    from tttr.engine.inference.model import Segment, load_model

    cfg = tiny_config("llama")
    path = write_gguf(tmp_path / "tiny-q4.gguf", cfg, tiny_weights(cfg, seed=4), quant="Q4_1")
    model = load_model(path)
    assert model.block_weights == 4 * cfg["num_hidden_layers"] + (cfg["vocab_size"] % 16 == 0)
    tokens = torch.tensor([5, 9, 13, 2, 7])

    def logits(m):
        cache = m.new_cache(32)
        return m.forward(tokens, torch.arange(5), [Segment(0, 5, cache)])

    blocks, dense = logits(model), logits(dense_copy(model))
    assert not torch.equal(blocks, dense)  # a different summation order did run
    assert (blocks - dense).abs().max() < 1e-4


def test_a_block_weight_is_not_also_held_dense(tmp_path):
    """Weights that run from their blocks have no fp32 copy: the model's fp32 weight bytes are
    those of the weights the file did not store as blocks (the norms) plus the one block weight
    the kernel cannot hold (the 266-row embedding: not whole groups of 16), and the checkpoint
    expands a quantized weight only when asked, to gguf's values."""
    from tttr.engine.inference.loader import load_checkpoint
    from tttr.engine.inference.model import load_model

    cfg = tiny_config("llama", tied=True)
    path = write_gguf(tmp_path / "tiny-q8.gguf", cfg, tiny_weights(cfg, seed=5), quant="Q8_0")
    ckpt = load_checkpoint(path)
    assert ckpt.quantized and not set(ckpt.quantized) & set(ckpt.tensors)
    unblocked = sum(t.nbytes for t in ckpt.tensors.values())
    model = load_model(path)
    assert cfg["vocab_size"] % 16 and model.block_weights == 4 * cfg["num_hidden_layers"]
    assert isinstance(model.layers[0].qkv, ops.QuantWeight) and isinstance(model.embed, torch.Tensor)
    assert _fp32_bytes(model) == unblocked + cfg["vocab_size"] * cfg["hidden_size"] * 4
    name = "model.layers.0.self_attn.q_proj.weight"
    fmt, raw = ckpt.quantized[name]
    assert torch.equal(ckpt.dense(name), torch.from_numpy(
        np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[fmt]), dtype=np.float32)))


@pytest.mark.slow
def test_the_default_model_holds_no_dense_copy_of_its_blocks():
    from tttr.engine.inference.model import load_model

    model = load_model()
    cfg = model.config
    assert model.block_weights == 4 * cfg.n_layers + 1  # every product, and the tied head
    norms = (2 * cfg.n_layers + 1) * cfg.d_model * 4
    assert _fp32_bytes(model) == norms  # 0.14 MB, where the expanded weights were 538 MB
    held = sum(w.nbytes for w in [model.embed] + [w for layer in model.layers for w in layer]
               if isinstance(w, ops.QuantWeight))
    assert held < 0.25 * 4 * (cfg.vocab_size * cfg.d_model + cfg.n_layers * (
        (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim * cfg.d_model + cfg.n_heads * cfg.head_dim * cfg.d_model
        + 3 * cfg.ffn_dim * cfg.d_model))


# ---------------------------------------------------------------------------------- row-local


@pytest.mark.parametrize("d", [64, 576, 70])
def test_rms_norm_matches_stock_and_is_row_invariant(d):
    x, w = torch.randn(9, d), torch.randn(d)
    y = crow.rms_norm(x, w, 1e-5)
    assert torch.allclose(y, F.rms_norm(x, (d,), w, 1e-5), atol=1e-5, rtol=1e-5)
    for i in (0, 4, 8):
        assert torch.equal(crow.rms_norm(x[i:i + 1].clone(), w, 1e-5)[0], y[i])
    delta, x2 = torch.randn(9, d), x.clone()
    y2 = crow.add_rms_norm(x2, delta, w, 1e-5)
    assert torch.equal(x2, x + delta)  # the residual lands in place
    assert torch.equal(y2, crow.rms_norm(x + delta, w, 1e-5))


def test_rope_in_place_is_the_pytorch_formula_bit_for_bit():
    d, half = 64, 32
    cos, sin = torch.randn(40, d), torch.randn(40, d)
    qkv = torch.randn(5, 7, d)
    pos = torch.tensor([0, 3, 39, 12, 12])
    qk = qkv[:, :5]
    expect = qk * cos[pos][:, None, :] + torch.roll(qk, half, -1) * sin[pos][:, None, :]
    rest = qkv[:, 5:].clone()
    crow.rope_(qkv, 5, cos, sin, pos)
    assert torch.equal(qkv[:, :5], expect) and torch.equal(qkv[:, 5:], rest)
    with pytest.raises(ValueError, match="past the 40-row table"):
        crow.rope_(qkv, 5, cos, sin, torch.tensor([0, 1, 2, 3, 40]))


def test_ops_rope_gives_the_same_bits_compiled_or_not(monkeypatch):
    d = 64
    torch.manual_seed(9)
    cos, sin = torch.randn(40, d), torch.randn(40, d)
    qkv = torch.randn(5, 7, d)
    pos = torch.tensor([0, 3, 39, 12, 12])
    expect = qkv.clone()
    crow.rope_(expect, 5, cos, sin, pos)
    rotated = qkv.clone()
    compiled = ops.rope(rotated, 5, cos, sin, pos)
    assert torch.equal(compiled, expect[:, :5]) and torch.equal(rotated, expect)  # in place
    _without_row_kernels(monkeypatch)
    kept = qkv.clone()
    fallback = ops.rope(kept, 5, cos, sin, pos)
    assert torch.equal(fallback, compiled) and fallback.is_contiguous()
    assert torch.equal(kept, qkv)  # PyTorch's path leaves x as it was
    half = qkv.to(torch.bfloat16)  # a dtype the compiled kernel does not take
    rotated_half = ops.rope(half, 5, cos.to(torch.bfloat16), sin.to(torch.bfloat16), pos)
    assert torch.allclose(rotated_half.float(), compiled, rtol=3e-2, atol=3e-2)


def test_ops_topk_takes_torch_topk_past_the_compiled_limit(monkeypatch):
    torch.manual_seed(8)
    x = torch.randn(4, 3000)
    ref = torch.topk(x, 5)
    vals, idx = ops.topk(x, 5)
    assert torch.equal(vals, ref.values) and torch.equal(idx, ref.indices)
    monkeypatch.setattr(crow, "topk", _refuse)
    for k in (crow.TOPK_MAX + 1, 0):
        vals, idx = ops.topk(x, k)
        assert torch.equal(vals, torch.topk(x, k).values) and torch.equal(idx, torch.topk(x, k).indices)
    vals, idx = ops.topk(x.t().contiguous().t(), 5)  # not contiguous
    assert torch.equal(vals, ref.values) and torch.equal(idx, ref.indices)
    _without_row_kernels(monkeypatch)
    vals, idx = ops.topk(x, 5)
    assert torch.equal(vals, ref.values) and torch.equal(idx, ref.indices)


def test_the_fingerprint_records_what_ops_describe_says():
    from tttr.engine.inference.fingerprint import fingerprint

    described = ops.describe()
    assert set(described) == {"attention_kernel", "linear_kernel", "row_kernels", "q8_kernel", "kernels_revision"}
    assert described["row_kernels"] == ("compiled" if crow.available() else "torch")
    assert described["linear_kernel"] == (f"blocks:{cquant.kernel_name()}" if cquant.available() else "dense")
    fp = fingerprint()
    assert {key: fp[key] for key in described} == described


def test_swiglu_matches_stock_and_is_row_invariant():
    gu = torch.randn(6, 2 * 100) * 6
    y = crow.silu_mul(gu)
    assert torch.allclose(y, F.silu(gu[:, :100]) * gu[:, 100:], atol=1e-5, rtol=1e-5)
    assert torch.equal(crow.silu_mul(gu[3:4].clone())[0], y[3])


def _refuse(*_args, **_kwargs):
    raise AssertionError("the compiled kernel ran where ops should have taken the PyTorch path")


def _without_row_kernels(monkeypatch) -> None:
    """As on a machine without a compiler: crow.available() is False, and a call into crow fails."""
    monkeypatch.setattr(crow, "available", lambda: False)
    for name in ("rope_", "topk", "draw", "rms_norm", "add_rms_norm", "silu_mul"):
        monkeypatch.setattr(crow, name, _refuse)


def test_draw_is_the_cumulative_sum_search(monkeypatch):
    """ops.draw gives the same index from the compiled scan, from torch.cumsum/searchsorted
    (no compiler), and for float64 probabilities (the sampler's filtered rows)."""
    from tttr.engine.inference.sampler import _uniforms

    cases = []
    for trial in range(20):
        logits = torch.randn(6, 3000) * (1 + trial % 5)
        if trial % 4 == 0:
            logits[:, 50:] = -1e4  # exact zeros after the softmax
        probs = torch.softmax(logits, -1)
        seeds, coords = [trial * 6 + i for i in range(6)], [(trial, i) for i in range(6)]
        cases.append((probs, _uniforms(seeds, coords)))
    compiled = [crow.draw(probs, u) for probs, u in cases]
    assert [ops.draw(probs, u) for probs, u in cases] == compiled
    monkeypatch.setattr(crow, "draw", _refuse)
    assert [ops.draw(probs.double(), u) for probs, u in cases] == compiled
    _without_row_kernels(monkeypatch)
    assert [ops.draw(probs, u) for probs, u in cases] == compiled


def test_compiled_attention_bodies_agree_bit_for_bit():
    """The attention's AVX-512 paths (16 keys' scores at once, values in registers) compute
    what its plain C loops compute."""
    from tttr.kernels import cattention

    flags = _cpu_flags().split()
    torch.manual_seed(5)
    n = 6
    k, v, q = torch.randn(n, 300, 3, 64), torch.randn(n, 300, 3, 64), torch.randn(n, 9, 64)
    seq, pos = torch.arange(n), torch.tensor([0, 15, 16, 47, 199, 299])
    outs = []
    for extra in ([], ["-mno-avx512f", "-mno-avx2"]) if "avx512f" in flags else ([], ["-mno-avx2"]):
        path, why = build_shared("attention-test" + "".join(extra), cattention.SOURCE, cattention._FLAGS + extra,
                                 "a test build", subdir="kernels")
        assert path is not None, why
        lib = ctypes.CDLL(str(path))
        p, i = ctypes.c_void_p, ctypes.c_int64
        lib.tttr_attention.argtypes = [p, p, p, i, i, i, i, p, p, i, i, i, i, i, i, ctypes.c_float, p, ctypes.c_int]
        out = torch.empty(n, 9, 64)
        assert lib.tttr_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(), k.stride(0), k.stride(1), v.stride(0),
                                  v.stride(1), seq.data_ptr(), pos.data_ptr(), n, n, 300, 9, 3, 64, 0.125,
                                  out.data_ptr(), 2) == 0
        outs.append(out)
    assert torch.equal(outs[0], outs[1])
    exact = torch.stack([torch.stack([
        torch.softmax(k[r, :pos[r] + 1, h // 3].double() @ q[r, h].double() * 0.125, 0) @ v[r, :pos[r] + 1, h // 3].double()
        for h in range(9)]) for r in range(n)])
    assert (outs[0].double() - exact).abs().max() < 1e-5


@pytest.mark.slow  # loads the default model twice, in a child interpreter
def test_without_c_kernels_the_model_runs_dense_with_the_same_logits(tmp_path):
    """TTTR_NO_C_KERNELS=1 (or no compiler): every step falls back to PyTorch, the
    fingerprint says so, and the logits agree with the compiled path to fp32 rounding."""
    import json
    import os
    import subprocess
    import sys

    from tttr.engine.inference.model import Segment, load_model
    from tttr.kernels.mode import kernel_mode

    cfg = tiny_config("llama")
    path = write_gguf(tmp_path / "tiny-q8.gguf", cfg, tiny_weights(cfg, seed=6), quant="Q8_0")
    tokens = [5, 9, 13, 2, 7, 11]
    code = (
        "import json, sys, torch\n"
        "from tttr.engine.inference.model import Segment, load_model\n"
        "from tttr.engine.inference.fingerprint import fingerprint\n"
        "from tttr.kernels.mode import kernel_mode\n"
        f"m = load_model({str(path)!r})\n"
        "with kernel_mode('invariant'):\n"
        f"    out = m.forward(torch.tensor({tokens}), torch.arange({len(tokens)}), [Segment(0, {len(tokens)}, m.new_cache(32))])\n"
        "fp = fingerprint()\n"
        "print(json.dumps({'blocks': m.block_weights, 'linear': fp['linear_kernel'], 'rows': fp['row_kernels'],"
        " 'attention': fp['attention_kernel'], 'logits': out.tolist()}))\n"
    )
    env = {**os.environ, "TTTR_NO_C_KERNELS": "1"}
    got = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                    check=True).stdout)
    assert (got["blocks"], got["linear"], got["rows"], got["attention"]) == (0, "dense", "torch", "blocked")
    model = load_model(path)
    assert model.block_weights > 0
    with kernel_mode("invariant"):
        here = model.forward(torch.tensor(tokens), torch.arange(len(tokens)), [Segment(0, len(tokens), model.new_cache(32))])
    assert (here - torch.tensor(got["logits"])).abs().max() < 1e-4


def test_topk_is_torch_topk_with_ties_to_the_lower_index():
    torch.manual_seed(7)
    x = torch.randn(9, 5000) * 3
    vals, idx = crow.topk(x, 5)
    ref = torch.topk(x, 5)
    assert torch.equal(vals, ref.values) and torch.equal(idx, ref.indices)
    tied = torch.tensor([[1.0, 3.0, float("nan"), 3.0, 2.0, 3.0]])
    vals, idx = crow.topk(tied, 4)
    assert idx.tolist() == [[1, 3, 5, 4]] and vals.tolist() == [[3.0, 3.0, 3.0, 2.0]]
    assert torch.equal(crow.topk(x[4:5].clone(), 5)[1][0], crow.topk(x, 5)[1][4])
    with pytest.raises(ValueError, match="k=0"):
        crow.topk(x, 0)
