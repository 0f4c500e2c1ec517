"""The KV pool: running sequences' caches as slots of one tensor. Arranging keeps every
cache's contents through leaves, joins, reorders and growth, keeps the rows past each
length at zero, and a forward pass over pooled caches computes what it computes over
caches of their own (bit for bit under the invariant kernels)."""

from __future__ import annotations

import random

import pytest
import torch

from tttr.engine.inference.kv_cache import KV_ALIGN, KVCache, KVPool
from tttr.engine.inference.model import Segment, load_model
from tttr.kernels.mode import kernel_mode
from tests.engine_tiny import tiny_config, tiny_weights, write_hf_folder

LAYERS, KVH, D = 2, 2, 4


def _cache(capacity: int, length: int, seed: int) -> KVCache:
    c = KVCache(LAYERS, capacity, KVH, D)
    g = torch.Generator().manual_seed(seed)
    c.k[:, :length] = torch.randn(LAYERS, length, KVH, D, generator=g)
    c.v[:, :length] = torch.randn(LAYERS, length, KVH, D, generator=g)
    c.length = length
    return c


def _contents(c: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
    return c.k[:, :c.length].clone(), c.v[:, :c.length].clone()


def _assert_pool_consistent(pool: KVPool, caches: list[KVCache], expected: list) -> None:
    assert pool.caches == caches
    for i, (c, (k, v)) in enumerate(zip(caches, expected)):
        assert c.pool is pool and c.slot == i
        assert torch.equal(c.k[:, :c.length], k) and torch.equal(c.v[:, :c.length], v)
        assert c.k.data_ptr() == pool.k[:, i].data_ptr()  # a view into the pool, not a copy
        assert not pool.k[:, i, c.length:].any() and not pool.v[:, i, c.length:].any()
    assert pool.capacity % KV_ALIGN == 0


def test_arrange_keeps_contents_through_leave_join_reorder_and_growth():
    pool = KVPool(LAYERS, KVH, D)
    a, b, c = _cache(50, 7, 1), _cache(90, 30, 2), _cache(20, 20, 3)
    want = {id(x): _contents(x) for x in (a, b, c)}
    pool.arrange([a, b, c])
    _assert_pool_consistent(pool, [a, b, c], [want[id(x)] for x in (a, b, c)])

    # b leaves, a new sequence joins: c moves down into b's slot in place, no new storage
    storage = pool.k.data_ptr()
    d = KVCache(LAYERS, 40, KVH, D, allocate=False)
    want[id(d)] = (torch.empty(LAYERS, 0, KVH, D), torch.empty(LAYERS, 0, KVH, D))
    pool.arrange([a, c, d])
    assert pool.k.data_ptr() == storage
    _assert_pool_consistent(pool, [a, c, d], [want[id(x)] for x in (a, c, d)])
    assert b.pool is None

    # d produces some keys in place, then the order changes: the pool is rebuilt, contents kept
    d.k[:, :5] = 1.5
    d.v[:, :5] = -2.0
    d.length = 5
    want[id(d)] = _contents(d)
    pool.arrange([d, a])
    _assert_pool_consistent(pool, [d, a], [want[id(x)] for x in (d, a)])

    # a longer sequence joins: the capacity grows to the next block boundary
    e = _cache(200, 3, 4)
    want[id(e)] = _contents(e)
    pool.arrange([d, a, e])
    assert pool.capacity == 256
    _assert_pool_consistent(pool, [d, a, e], [want[id(x)] for x in (d, a, e)])

    pool.release()
    assert pool.k is None and all(x.pool is None for x in (a, d, e))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = tiny_config("llama")
    folder = write_hf_folder(tmp_path_factory.mktemp("tiny") / "hf", cfg, tiny_weights(cfg))
    return load_model(folder)


def _run(model, prompts, steps, pooled: bool, order_seed: int):
    """Prefill every prompt, then decode `steps` tokens for each; one sequence (the last)
    joins late, so some passes mix its prefill with the others' decode rows and the decode
    slots are not consecutive. Returns the logits of every pass."""
    rng = random.Random(order_seed)
    cfg = model.config
    caches = [KVCache(cfg.n_layers, 64, cfg.n_kv_heads, cfg.head_dim, allocate=not pooled) for _ in prompts]
    pool = KVPool(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim) if pooled else None
    order = list(range(len(prompts)))
    rng.shuffle(order)
    late = order.pop()  # joins after two decode steps
    fed = {i: list(p) for i, p in enumerate(prompts)}
    out = []
    for step in range(steps + 1):
        running = order + ([late] if step >= 2 else [])
        if pool is not None:
            # the late one sits between the others, so the decoders' slots are not consecutive
            slot_order = running[:1] + [late] + running[1:-1] if step >= 2 else running
            pool.arrange([caches[i] for i in slot_order])
        tokens, positions, segments = [], [], []
        for i in running:
            c = caches[i]
            feed = fed[i][c.length:]
            segments.append(Segment(len(tokens), len(tokens) + len(feed), c))
            tokens += feed
            positions += range(c.length, c.length + len(feed))
        logits = model.forward(torch.tensor(tokens), torch.tensor(positions), segments)
        out.append(logits)
        for seg, i in zip(segments, running):
            seg.cache.length += seg.end - seg.start
            fed[i].append(int(logits[seg.end - 1].argmax()))
    return out


@pytest.mark.parametrize("mode", ["invariant", "fast"])
def test_forward_over_pooled_caches_equals_own_caches(tiny, mode):
    g = random.Random(5)
    prompts = [[g.randrange(3, tiny.config.vocab_size - 3) for _ in range(n)] for n in (3, 9, 1, 14)]
    with kernel_mode(mode):
        own = _run(tiny, prompts, 6, pooled=False, order_seed=1)
        pooled = _run(tiny, prompts, 6, pooled=True, order_seed=1)
    for a, b in zip(own, pooled):
        if mode == "invariant":
            assert torch.equal(a, b)
        else:
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)
