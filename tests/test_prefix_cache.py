"""Prefix reuse (engine/inference/prefix_cache.py): the cache alone on hand-made caches, then
the engine on the default model, where a sequence that starts from a kept or a running
sequence's prefix must produce the same tokens and logits digests as one prefilled whole."""

from __future__ import annotations

import pytest

from tttr.engine.inference.kv_cache import KVCache
from tttr.engine.inference.prefix_cache import PrefixCache, common_prefix
from tttr.engine.inference.sampler import SamplingParams
from tttr.engine.inference.sequence import Sequence
from tttr.engine.replay.runtime import Runtime
from tttr.kernels.mode import Q8, kernel_mode


def _cache(n: int, capacity: int = 64, fill: float = 1.0) -> KVCache:
    c = KVCache(2, capacity, 1, 4)
    c.k.fill_(fill)
    c.v.fill_(-fill)
    c.length = n
    return c


def test_the_longest_prefix_is_copied_and_the_last_prompt_token_is_left_to_compute():
    cache = PrefixCache(min_tokens=4)
    cache.keep(list(range(40)), _cache(30, fill=1.0))
    cache.keep([7] * 30, _cache(20, fill=2.0))
    new = KVCache(2, 50, 1, 4, allocate=False)
    assert cache.fill(list(range(25)), new) == 24  # 25 in common with the first, less the last token
    assert new.length == 24 and new.capacity == 50 and new.k.shape == (2, 50, 1, 4)
    assert bool((new.k[:, :24] == 1).all()) and bool((new.v[:, :24] == -1).all())
    other = KVCache(2, 50, 1, 4, allocate=False)
    assert cache.fill([7] * 10 + [8], other) == 10 and bool((other.k[:, :10] == 2).all())
    none = KVCache(2, 50, 1, 4, allocate=False)
    assert cache.fill([9, 9, 9, 9, 9, 9], none) == 0 and none.k is None and none.length == 0
    assert cache.hits == 2 and cache.reused_tokens == 34


def test_a_running_sequence_is_a_source_and_a_longer_prefix_replaces_the_ones_it_covers():
    cache = PrefixCache(min_tokens=4)
    cache.keep(list(range(10)), _cache(10))
    cache.keep(list(range(20)), _cache(20))
    assert len(cache) == 1  # the first is a prefix of the second
    cache.keep(list(range(15)), _cache(15))
    assert len(cache) == 1  # covered by the kept one
    running = _cache(30, fill=3.0)
    new = KVCache(2, 64, 1, 4, allocate=False)
    assert cache.fill(list(range(40)), new, [(list(range(35)), running)]) == 30  # the running one is longer
    assert bool((new.k[:, :30] == 3).all())
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2


def test_the_kept_bytes_stay_under_the_bound_oldest_out_first():
    one = 2 * 2 * 30 * 4 * 4  # k and v of 30 positions: [2 layers, 30, 1, 4] fp32
    cache = PrefixCache(max_bytes=2 * one, min_tokens=4)
    for first in range(3):
        cache.keep([first] * 40, _cache(30))
    assert len(cache) == 2 and cache.bytes == 2 * one
    assert cache.fill([0] * 40, KVCache(2, 64, 1, 4, allocate=False)) == 0  # the oldest went
    assert cache.fill([2] * 40, KVCache(2, 64, 1, 4, allocate=False)) == 30
    cache.keep([5] * 3, _cache(3))
    assert len(cache) == 2  # shorter than min_tokens: not kept


def test_a_prefix_serves_its_own_kernel_mode_only():
    """`invariant` and `invariant-q8` keys and values are different bits: each kept prefix
    serves sequences of the mode it was computed in; `fast` never keeps or takes one."""
    cache = PrefixCache(min_tokens=4)
    cache.keep(list(range(30)), _cache(30, fill=1.0), "invariant")
    cache.keep(list(range(30)), _cache(20, fill=2.0), Q8)
    cache.keep(list(range(30)), _cache(30, fill=3.0), "fast")
    assert len(cache) == 2  # the q8 one is not "covered" by the longer invariant one
    q8 = KVCache(2, 50, 1, 4, allocate=False)
    assert cache.fill(list(range(40)), q8, mode=Q8) == 20 and bool((q8.k[:, :20] == 2).all())
    fp32 = KVCache(2, 50, 1, 4, allocate=False)
    assert cache.fill(list(range(40)), fp32) == 30 and bool((fp32.k[:, :30] == 1).all())
    fast = KVCache(2, 50, 1, 4, allocate=False)
    assert cache.fill(list(range(40)), fast, [(list(range(40)), _cache(30))], mode="fast") == 0 and fast.k is None


@pytest.mark.parametrize("mode", ["invariant", Q8])
def test_the_engine_gives_the_same_tokens_and_digests_from_a_reused_prefix(mode):
    runtime = Runtime(kernel_mode=mode)
    try:
        engine, tok = runtime.engine, runtime.tokenizer
        prompt = tok.encode(tok.apply_chat_template(
            [{"role": "system", "content": "You are a Linux shell agent working in the directory /work."},
             {"role": "user", "content": "Task: count the lines of every file in /work."}],
            add_generation_prompt=True))

        def run() -> list:
            with kernel_mode(mode):
                first = engine.submit(Sequence(prompt, SamplingParams(temperature=0.7, seed=3), 12)).result()
                longer = prompt + [r.token_id for r in first] + tok.encode("\nexit code 0")
                a = engine.submit(Sequence(longer + [11], SamplingParams(temperature=0.7, seed=5), 8))
                b = engine.submit(Sequence(longer + [12, 13], SamplingParams(temperature=0.7, seed=6), 8))
                return first + a.result() + b.result()

        alone = run()
        with runtime.reusing_prefixes() as cache:
            reused = run()
            assert cache.hits >= 2 and cache.reused_tokens >= 2 * len(prompt)
        assert engine.prefixes is None  # only inside the block
        assert [(r.token_id, r.digest) for r in reused] == [(r.token_id, r.digest) for r in alone]
        # what changed is the rows computed: the later sequences prefilled only their new tokens
        assert sum(r.batch_rows for r in reused[12:]) < sum(r.batch_rows for r in alone[12:])
    finally:
        runtime.close()


def test_fast_sequences_never_reuse_a_prefix():
    mode = "fast"
    runtime = Runtime(kernel_mode=mode)
    try:
        engine = runtime.engine
        prompt = list(range(100, 140))
        with runtime.reusing_prefixes() as cache, kernel_mode(mode):
            engine.submit(Sequence(prompt, SamplingParams(temperature=0.0), 4)).result()
            engine.submit(Sequence(prompt + [5], SamplingParams(temperature=0.0), 4)).result()
            assert cache.hits == 0 and len(cache) == 0
    finally:
        runtime.close()


def test_an_inner_block_shares_the_outer_cache():
    """A record or replay inside an experiment's `reusing_prefixes` (a bisect's trials) keeps
    the experiment's cache rather than starting an empty one."""
    runtime = Runtime(kernel_mode="invariant")
    with runtime.reusing_prefixes() as outer:
        with runtime.reusing_prefixes() as inner:
            assert inner is outer
        assert runtime._prefixes is outer  # the inner block left it in place
    assert runtime._prefixes is None


@pytest.mark.slow  # two recordings of a task with the default model
def test_a_recording_reuses_each_steps_prefix_and_records_the_same_tokens_and_digests(tmp_path, monkeypatch):
    """`tttr record` runs its agent inside `reusing_prefixes` (step k's prompt extends step
    k-1's): the run's tokens and logits digests equal a recording without reuse, same seed."""
    import contextlib

    from tttr.engine.replay import runs
    from tttr.sessions.store import Store

    runtime = Runtime(kernel_mode="invariant")
    kept = []
    reusing = Runtime.reusing_prefixes

    def counting(self):
        with reusing(self) as cache:
            kept.append(cache)
            yield cache

    def recorded(name: str) -> list:
        with Store.open(tmp_path / f"{name}.db", create=True) as store:
            run = runs.record(store, "rotate-logs", runtime=runtime, seed=7)
            return [(e.site, e.value) for e in store.events(run.run_id) if e.kind in ("token", "logits")]

    try:
        monkeypatch.setattr(Runtime, "reusing_prefixes", contextlib.contextmanager(counting))
        reused = recorded("reused")
        assert len(kept) == 1 and kept[0].hits >= 1 and kept[0].reused_tokens > 100
        monkeypatch.setattr(Runtime, "reusing_prefixes", lambda self: contextlib.nullcontext())
        plain = recorded("plain")
    finally:
        runtime.close()
    strip = [(site, {k: v for k, v in value.items() if k != "batch"}) for site, value in reused]
    assert len(plain) > 20 and strip == [(site, {k: v for k, v in value.items() if k != "batch"})
                                         for site, value in plain]
