"""Products from Q4_K, Q5_K, Q6_K and Q5_0 blocks (kernels.kquants repacks them into the
layouts kernels.cquant reads): every weight expanded to gguf's dequantized value bit for bit,
products close to the dense fp32 product and batch-invariant bit for bit, the same bits from
every instruction-set body, parts of different types stacked into one product, and tiny
GGUF models in each type running from their blocks with the dense path's logits."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tttr.kernels import cquant, ops
from tests.engine_tiny import tiny_config, tiny_weights, write_gguf
from tests.kernel_helpers import assert_rows_invariant, dense_copy, random_weight
from tests.test_kernels_blocks import each_body

NEW = ("Q4_K", "Q5_K", "Q6_K", "Q5_0")


def _weight(fmt: str, n: int, k: int, seed: int) -> tuple[np.ndarray, torch.Tensor]:
    """Random valid GGUF rows of `fmt` and gguf's fp32 values for them."""
    raw, values = random_weight(fmt, n, k, seed)
    return raw, torch.from_numpy(values)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("fmt", NEW)
def test_a_block_weight_holds_ggufs_values_bit_for_bit(fmt):
    """rows/dense give exactly gguf.quants.dequantize's fp32 bits (signed zeros too), for random
    blocks: every scale, minimum and quant bit pattern, fp16 scales of either sign, subnormal
    ones included."""
    for seed in range(3):
        raw, values = _weight(fmt, 64, 512, seed)
        qw = ops.block_weight(fmt, raw)
        assert isinstance(qw, ops.QuantWeight) and qw.fmt == fmt and qw.shape == (64, 512)
        assert torch.equal(_bits(ops.dense(qw)), _bits(values))
        ids = torch.tensor([63, 0, 17, 17, 31, 16, 15, 48])
        assert torch.equal(_bits(ops.embedding(qw, ids)), _bits(values.index_select(0, ids)))
    assert values.abs().max() > 0.01 and (values != 0).float().mean() > 0.9  # not trivially zero


@pytest.mark.parametrize("fmt", NEW)
def test_the_product_is_the_dense_product_of_the_same_values(fmt):
    raw, values = _weight(fmt, 48, 768, seed=11)
    qw = ops.block_weight(fmt, raw)
    x = torch.randn(9, 768)
    out = ops.linear(x, qw)
    exact = x.double() @ values.double().T
    magnitude = x.double().abs() @ values.double().abs().T  # what fp32 rounding scales with
    assert out.dtype == torch.float32 and out.shape == (9, 48)
    assert ((out.double() - exact).abs() <= 1e-5 * magnitude).all()
    assert ((ops.dense(qw) @ x.T).T.double() - exact).abs().max() < 1e-5 * magnitude.max()


@pytest.mark.parametrize("fmt", NEW)
def test_rows_do_not_depend_on_the_batch_their_place_or_threads(fmt):
    raw, _ = _weight(fmt, 64, 512, seed=12)
    qw = ops.block_weight(fmt, raw)
    assert_rows_invariant(lambda x: ops.linear(x, qw), torch.randn(17, 512))


def _mixed(k: int = 256, seed: int = 20):
    """A weight stacked from one part of every type the products take, and its gguf values."""
    parts, values = [], []
    for i, fmt in enumerate(cquant.FORMATS):
        n = 16 * (i % 3 + 1)
        raw, v = _weight(fmt, n, k, seed + i)
        parts.append((fmt, raw))
        values.append(v)
    return parts, torch.cat(values)


def test_every_instruction_set_body_gives_the_same_bits_for_every_layout():
    parts, _ = _mixed()
    qw = ops.block_weights(parts)
    outs = each_body(qw, torch.randn(11, 256))
    assert len(outs) >= 2
    assert all(torch.equal(o, outs["c"]) for o in outs.values()), "the bodies disagree"


def test_parts_of_different_types_are_one_product():
    """A fused q/k/v whose parts the file stored as different types runs from all their blocks
    in one call: each output row is what that part alone gives (a row depends only on its
    weights), and the rows are gguf's values."""
    parts, values = _mixed()
    qw = ops.block_weights(parts)
    assert qw is not None and qw.fmt == "+".join(cquant.FORMATS) and qw.shape == (values.shape[0], 256)
    assert torch.equal(_bits(ops.dense(qw)), _bits(values))
    ids = torch.tensor([0, values.shape[0] - 1, 40, 17, 95, 16])
    assert torch.equal(_bits(ops.embedding(qw, ids)), _bits(values.index_select(0, ids)))
    x = torch.randn(5, 256)
    out = ops.linear(x, qw)
    alone = torch.cat([ops.linear(x, ops.block_weight(fmt, raw)) for fmt, raw in parts], dim=1)
    assert torch.equal(out, alone)
    assert (out.double() - x.double() @ values.double().T).abs().max() < 1e-4
    assert qw.nbytes < values.numel() * 4 * 0.4


@pytest.mark.parametrize("fmt, bits", [("Q4_K", 4.75), ("Q6_K", 6.625)])
def test_k_quants_are_held_near_the_files_size(fmt, bits):
    """Q4_K and Q6_K keep their super-block scales apart (layouts 4 and 5): a product reads 4.75
    and 6.625 bits a weight (the file: 4.5 and 6.5625), not 6 and 10 as a scale per block did;
    the weights stay gguf's, bit for bit, at every super-block of a wider row."""
    raw, values = _weight(fmt, 32, 1024, seed=40)
    qw = ops.block_weight(fmt, raw)
    assert qw.nbytes * 8 / values.numel() == bits
    assert torch.equal(_bits(ops.dense(qw)), _bits(values))
    ids = torch.tensor([31, 5, 16])
    assert torch.equal(_bits(ops.embedding(qw, ids)), _bits(values.index_select(0, ids)))


def test_weights_that_do_not_fit_stay_dense():
    raw, _ = _weight("Q4_K", 64, 256, seed=30)
    assert ops.block_weight("Q4_K", raw[:40]) is None  # 40 rows: not whole groups of 16
    q5, _ = _weight("Q5_0", 16, 96, seed=31)
    assert ops.block_weight("Q5_0", q5) is not None  # 32-input blocks: 96 inputs fit
    assert ops.block_weights([("Q4_K", raw), ("Q5_0", q5)]) is None  # the parts' inputs differ
    assert ops.block_weights([("Q4_K", raw), ("Q4_K", raw[:40])]) is None
    assert ops.block_weight("Q3_K", np.zeros((16, 110), np.uint8)) is None  # a type the products do not take
    with pytest.raises(ValueError, match="cannot pack"):
        cquant.pack("Q6_K", raw[:, :210], 64, 128)


# ------------------------------------------------------------------------------ tiny models


def _kquant_config(arch: str = "llama") -> dict:
    """The tiny model with every product's inputs a multiple of 256 (a K-quant super-block)."""
    cfg = tiny_config(arch)
    cfg.update(hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    return cfg


def _greedy(model, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """n greedy tokens after the prompt (prefill, then one token a step), and the prefill's logits."""
    from tttr.engine.inference.model import Segment

    cache = model.new_cache(64)
    logits = model.forward(torch.tensor(prompt), torch.arange(len(prompt)), [Segment(0, len(prompt), cache)])
    cache.length = len(prompt)
    first = logits
    out = []
    for _ in range(n):
        tok = int(logits[-1].argmax())
        out.append(tok)
        logits = model.forward(torch.tensor([tok]), torch.tensor([cache.length]), [Segment(0, 1, cache)])
        cache.length += 1
    return out, first


def _runs_like_dense(model, cfg) -> None:
    prompt = [5, 9, 13, 2, 7, 40, 100]
    tokens, logits = _greedy(model, prompt, 8)
    dense_tokens, dense_logits = _greedy(dense_copy(model), prompt, 8)
    assert not torch.equal(logits, dense_logits)  # a different summation order did run
    assert (logits - dense_logits).abs().max() < 1e-4 * max(1.0, dense_logits.abs().max().item())
    assert tokens == dense_tokens


@pytest.mark.parametrize("fmt", NEW)
def test_a_tiny_model_in_each_type_runs_from_its_blocks(tmp_path, fmt):
    from tttr.engine.inference.model import load_model

    cfg = _kquant_config()
    path = write_gguf(tmp_path / f"tiny-{fmt}.gguf", cfg, tiny_weights(cfg, seed=7), quant=fmt)
    model = load_model(path)
    assert model.block_weights == 4 * cfg["num_hidden_layers"]  # the 266-row head stays dense
    assert model.layers[1].qkv.fmt == fmt and model.layers[1].down.fmt == fmt
    assert isinstance(model.embed, torch.Tensor) and model.embed.shape == (cfg["vocab_size"], 256)
    _runs_like_dense(model, cfg)


def test_a_tiny_model_of_mixed_types_runs_every_product_from_blocks(tmp_path):
    """As llama.cpp's Q4_K_M writes them: q/k/v of three types in one layer, gate/up of two."""
    from tttr.engine.inference.model import load_model

    types = {"attn_q": "Q4_K", "attn_k": "Q6_K", "attn_v": "Q5_0", "attn_output": "Q5_K", "ffn_gate": "Q4_K",
             "ffn_up": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"}
    cfg = _kquant_config("qwen2")
    path = write_gguf(tmp_path / "tiny-mixed.gguf", cfg, tiny_weights(cfg, seed=8),
                      quant=lambda name: types[name.split(".")[-2]])
    model = load_model(path)
    assert model.block_weights == 4 * cfg["num_hidden_layers"]
    assert [model.layers[0].qkv.fmt, model.layers[0].gate_up.fmt, model.layers[0].o.fmt] == \
        ["Q4_K+Q6_K+Q5_0", "Q4_K+Q6_K", "Q5_K"]
    _runs_like_dense(model, cfg)


def test_other_types_load_dense_and_one_gguf_cannot_read_is_refused(tmp_path):
    """A type the products do not take (Q4_0 here) loads dense through gguf; one gguf cannot
    dequantize (Q8_1) is refused in one line naming it and what is supported."""
    from tttr.engine.errors import EngineError
    from tttr.engine.inference.model import load_model

    cfg = tiny_config("llama")
    down = "blk.0.ffn_down.weight"
    path = write_gguf(tmp_path / "tiny-q4_0.gguf", cfg, tiny_weights(cfg, seed=9),
                      quant=lambda name: "Q4_0" if name == down else "Q8_0")
    model = load_model(path)
    assert model.block_weights == 4 * cfg["num_hidden_layers"] - 1
    assert isinstance(model.layers[0].down, torch.Tensor) and model.layers[0].down.shape == (64, 96)

    # the same file with that tensor's type changed to Q8_1 (its bytes are never read)
    data = bytearray(path.read_bytes())
    at = data.index(down.encode()) + len(down)
    at += 4 + 8 * int.from_bytes(data[at:at + 4], "little")  # past n_dims and the dims
    assert int.from_bytes(data[at:at + 4], "little") == gguf.GGMLQuantizationType.Q4_0
    data[at:at + 4] = int(gguf.GGMLQuantizationType.Q8_1).to_bytes(4, "little")
    bad = tmp_path / "tiny-q8_1.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(EngineError, match=r"^unsupported quantization type Q8_1 \(tensor 'blk.0.ffn_down.weight' "
                                          r"in tiny-q8_1.gguf\): products run from Q4_1, Q8_0, Q4_K, Q5_0, Q5_K, Q6_K"):
        load_model(bad)
