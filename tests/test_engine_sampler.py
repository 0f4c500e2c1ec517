"""Sampler: parameters check themselves; the draw for (seed, step, position) depends on
nothing else: not on other draws, not on the batch, not on where generation resumed."""

from __future__ import annotations

import pytest
import torch

from tttr.engine.errors import EngineError
from tttr.engine.inference.sampler import SamplingParams, filtered_distribution, sample, uniform


@pytest.mark.parametrize("kwargs, field", [
    ({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"),
    ({"seed": -1}, "seed"), ({"seed": 2**63}, "seed"), ({"seed": 1.5}, "seed"),
])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(EngineError, match=field) as err:
        SamplingParams(**kwargs)
    assert err.value.exit_code == 2


def test_params_are_frozen():
    p = SamplingParams(temperature=0.7, seed=3)
    with pytest.raises(AttributeError):
        p.seed = 4  # type: ignore[misc]


def test_uniform_is_a_pure_function_of_its_coordinates():
    coords = [(s, st, p) for s in (0, 1, 2**63 - 1) for st in (0, 1, 7) for p in (0, 1, 500)]
    first = {c: uniform(*c) for c in coords}
    # drawn again in reverse order and interleaved with other draws: the same values
    for c in reversed(coords):
        uniform(c[0] + 1 if c[0] < 2**62 else 0, c[1], c[2])
        assert uniform(*c) == first[c]
    assert len(set(first.values())) == len(coords)
    assert all(0.0 <= u < 1.0 for u in first.values())


def test_uniform_is_roughly_uniform():
    us = torch.tensor([uniform(42, 0, p) for p in range(4000)])
    assert abs(us.mean().item() - 0.5) < 0.02
    assert (us < 0.1).float().mean().item() == pytest.approx(0.1, abs=0.02)


def test_sample_depends_only_on_logits_and_coordinates():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1000, generator=g) * 3
    p = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=11)
    a = [sample(logits, p, 2, pos) for pos in range(30)]
    b = [sample(logits, p, 2, pos) for pos in reversed(range(30))][::-1]
    assert a == b
    assert len(set(a)) > 3  # it does vary with the position
    assert sample(logits, SamplingParams(), 2, 0) == int(logits.argmax())


def test_filters_keep_the_right_tokens_in_a_fixed_order():
    logits = torch.log(torch.tensor([0.1, 0.4, 0.1, 0.3, 0.1]))
    ids, probs = filtered_distribution(logits, SamplingParams(temperature=1.0, top_k=3, seed=0))
    assert ids.tolist() == [0, 1, 3]  # of the tied 0.1s the lowest id is kept; draw order is by id
    assert probs.sum().item() == pytest.approx(1.0)
    ids, _ = filtered_distribution(logits, SamplingParams(temperature=1.0, top_p=0.7, seed=0))
    assert ids.tolist() == [1, 3]
    ids, probs = filtered_distribution(logits, SamplingParams(temperature=1.0, seed=0))
    assert ids.tolist() == [0, 1, 2, 3, 4] and probs.tolist() == pytest.approx([0.1, 0.4, 0.1, 0.3, 0.1])
    ids, _ = filtered_distribution(logits, SamplingParams(temperature=1.0, top_p=0.01, seed=0))
    assert ids.tolist() == [1]


def test_inverse_cdf_matches_the_distribution():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    p = SamplingParams(temperature=1.0, seed=5)
    counts = torch.bincount(torch.tensor([sample(logits, p, 0, pos) for pos in range(3000)]), minlength=3)
    assert (counts / 3000).tolist() == pytest.approx([0.5, 0.3, 0.2], abs=0.03)


def test_top_p_shortcut_keeps_the_same_nucleus():
    g = torch.Generator().manual_seed(1)
    for scale in (1.0, 4.0, 12.0):  # flat to peaky: the nucleus is inside the top 256 or not
        logits = torch.randn(5000, generator=g) * scale
        p = SamplingParams(temperature=1.0, top_p=0.9, seed=0)
        ids, probs = filtered_distribution(logits, p)
        full = torch.softmax(logits.double(), -1)
        order = torch.sort(full, descending=True, stable=True).indices
        n = int(torch.searchsorted(torch.cumsum(full[order], 0), torch.tensor([0.9], dtype=torch.float64))) + 1
        assert ids.tolist() == sorted(order[:n].tolist()), scale
