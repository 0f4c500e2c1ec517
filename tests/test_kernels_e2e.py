"""End to end on the default model: in invariant mode the greedy output and the logits
digests of a prompt do not depend on the batch it shares, nor on how its prompt is fed."""

import pytest

from tttr.kernels.mode import kernel_mode

pytestmark = pytest.mark.slow  # generates with the default model in many batch compositions


@pytest.fixture(scope="module")
def model():
    import torch

    from tttr.engine.inference.model import load_model

    try:
        m = load_model()
    except Exception as exc:  # noqa: BLE001 - no embedded model on this machine
        pytest.skip(f"default model unavailable: {exc}")
    # One thread: on a loaded 2-core machine a 2-thread OpenMP region can wait a whole
    # scheduler slice per op. Invariance across thread counts is tested in test_kernels_invariant.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield m
    torch.set_num_threads(before)


def _target(model):
    tok = model.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": "Delete every .tmp file in /work."}],
                                              add_generation_prompt=True))


def test_greedy_output_and_digests_identical_across_batch_compositions(model):
    from tests.kernel_helpers import greedy_among_others

    results, layouts = greedy_among_others(model, "invariant", _target(model),
                                           ((0, 0, 1), (3, 0, 1), (5, 5, 1), (9, 4, 1), (14, 11, 1)), seed=7)
    assert len(layouts) == 5  # the compositions really differed
    assert len(results) == 1


def test_prefill_chunks_and_token_by_token_identical(model):
    from tttr.engine.bench.determinism import _forward_digests

    ids = _target(model)[:16]
    with kernel_mode("invariant"):
        one = _forward_digests(model, ids, None)
        assert _forward_digests(model, ids, 5) == one
        assert _forward_digests(model, ids, 1) == one


def test_determinism_bench_reports_one_and_one_for_invariant(model):
    from tttr.engine.bench import determinism

    result = determinism.run(determinism.Config(runs=2, tokens=3, prefill_tokens=12), model=model, progress=None)
    for half in ("greedy", "sampled"):
        inv = result[half]["invariant"]
        assert inv["unique_completions"] == 1 and inv["unique_digest_sequences"] == 1
        assert inv["first_differing_position"] is None
    assert result["invariant"] == {"unique_completions": 1, "unique_digest_sequences": 1}
    assert set(result["fast"]) == {"unique_completions", "unique_digest_sequences"}
    assert result["prefill_chunked_decode_identical"]["invariant"] is True
    assert isinstance(result["prefill_chunked_decode_identical"]["fast"], bool)
    assert any("invariant" in line for line in determinism.lines(result))


def test_determinism_bench_takes_invariant_q8_beside_fast(model):
    """`tttr bench determinism --kernels invariant-q8`: the 8-bit-activation mode is shown
    beside fast, and is invariant too (one completion, one digest sequence, one prefill path)."""
    from tttr.engine.bench import determinism

    cfg = determinism.Config(runs=3, tokens=3, prefill_tokens=12, kernels="invariant-q8")
    result = determinism.run(cfg, model=model, progress=None)
    assert set(result["prefill_paths"]) == {"fast", "invariant-q8"} and "invariant" not in result
    for half in ("greedy", "sampled"):
        q8 = result[half]["invariant-q8"]
        assert q8["unique_completions"] == 1 and q8["unique_digest_sequences"] == 1
        assert q8["batch_layouts"] > 1  # the compositions really differed
    assert result["prefill_chunked_decode_identical"]["invariant-q8"] is True
    assert any(line.split()[1:2] == ["invariant-q8"] for line in determinism.lines(result))


def test_determinism_config_refuses_a_mode_that_is_not_invariant():
    from tttr.engine.bench import determinism

    with pytest.raises(ValueError, match="not an invariant mode"):
        determinism.Config(kernels="fast")
