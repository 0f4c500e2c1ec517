"""bench engine --synthetic's printed report: each mode's prefill fraction says what it is a
fraction of (invariant-q8's integer products are not bound by the fp32 FMA peak)."""

from __future__ import annotations

from tttr.engine.bench.engine_synthetic import format_report


def _report(mode: str) -> dict:
    side = {"decode_tok_s": 38.28, "decode_tok_per_cpu_s": 38.5, "ttft_s": 0.23, "decode_bandwidth_fraction": 0.7,
            "prefill_512_tok_s": 157.63, "prefill_512_fma_fraction": 1.26, "prefill_2048_tok_s": 82.57,
            "prefill_2048_fma_fraction": 0.7}
    return {"synthetic": "llama-1b", "weight_bytes": 666968064, "file_types": {"Q4_K": 96, "Q6_K": 17},
            "shape": {"arch": "llama", "layers": 16, "d_model": 2048, "heads": 32, "kv_heads": 8, "ffn": 8192,
                      "vocab": 49152},
            "kernel_mode": mode, "tokens": 32, "rounds": 1, "threads": 1,
            "limits": {"bandwidth_gbs": 36.7, "fma_peak_gflops": 247.0, "threads": 1},
            "tttr": {**side, "batch8_tok_s": 134.34}, "llama_cpp": dict(side), "llama_cpp_status": "measured",
            "tttr_over_llama_cpp": {"decode": 1.57, "prefill_512_tok_s": 3.14, "prefill_2048_tok_s": 1.93,
                                    "batch8_vs_llama_single": 5.5},
            "cold_start_s": None}


def test_prefill_rows_say_the_fma_peak_is_not_the_q8_modes_bound():
    q8 = [line for line in format_report(_report("invariant-q8")).splitlines() if line.startswith("prefill")]
    fp32 = [line for line in format_report(_report("invariant")).splitlines() if line.startswith("prefill")]
    assert len(q8) == len(fp32) == 2
    assert all("126% / 126% of the limit" in rows[0] for rows in (q8, fp32))
    assert all("of the fp32 FMA peak: integer products" in line for line in q8)
    assert not any("integer products" in line for line in fp32)
    assert q8[1].endswith("(2,048: target >= 1.0x)") and fp32[1].endswith("(2,048: target >= 1.0x)")
