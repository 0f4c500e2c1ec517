"""The compiled decode step (kernels.cdecode): a pass whose rows each decode one token runs all
its layers in one call, and gives the per-op path's logits bit for bit (for 1, 2, 3 and 8
sequences at different lengths, every kernel mode, 1 and 2 threads), a row's bits whatever
shares its pass; and models or passes it does not run take the per-op path."""

from __future__ import annotations

import pytest
import torch

from tttr.kernels import cdecode, ops
from tttr.kernels.mode import MODES, Q8, kernel_mode
from tests.engine_tiny import tiny_config, tiny_weights, write_gguf


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tmp_path_factory):
    """A tiny model whose products all run from Q4_1 blocks (qwen2: with the q/k/v bias)."""
    from tttr.engine.inference.model import load_model

    cfg = tiny_config(request.param)
    path = write_gguf(tmp_path_factory.mktemp("fused") / f"tiny-{request.param}.gguf", cfg,
                      tiny_weights(cfg, seed=11), quant="Q4_1")
    m = load_model(path)
    assert m.block_weights >= 4 * cfg["num_hidden_layers"]
    assert (m.layers[0].qkv_bias is not None) == (request.param == "qwen2")
    return m


@pytest.fixture
def counted(monkeypatch):
    """Counts the passes the compiled step ran, and switches it off with `counted.off = True`."""
    real = ops.decode_layers

    class Counter:
        ran = 0
        off = False
        outs = []  # what each compiled pass returned (the final norm's output)

    def decode_layers(*args):
        if Counter.off:
            return None
        out = real(*args)
        Counter.ran += out is not None
        Counter.outs.append(out)
        return out

    monkeypatch.setattr(ops, "decode_layers", decode_layers)
    return Counter


def _decode(model, lengths, steps=3, pooled=True, seed=0):
    """Prefill sequences of `lengths` random tokens, then decode `steps` tokens for all of
    them together; the logits of each decode pass."""
    from tttr.engine.inference.kv_cache import KVCache, KVPool
    from tttr.engine.inference.model import Segment

    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    caches = [KVCache(cfg.n_layers, 64, cfg.n_kv_heads, cfg.head_dim, allocate=pooled is False) for _ in lengths]
    if pooled:
        KVPool(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim).arrange(caches)
    for cache, n in zip(caches, lengths):
        model.forward(torch.randint(0, cfg.vocab_size, (n,), generator=g), torch.arange(n), [Segment(0, n, cache)])
        cache.length = n
    out = []
    for _ in range(steps):
        tokens = torch.randint(0, cfg.vocab_size, (len(caches),), generator=g)
        positions = torch.tensor([c.length for c in caches])
        out.append(model.forward(tokens, positions, [Segment(i, i + 1, c) for i, c in enumerate(caches)]))
        for c in caches:
            c.length += 1
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("lengths", [[5], [3, 17], [4, 11, 2], [5, 9, 1, 30, 12, 7, 2, 20]])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_compiled_step_gives_the_per_op_logits(model, counted, mode, lengths, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with kernel_mode(mode):
            fused = _decode(model, lengths)
            # every decode pass ran compiled (and a one-token prompt's prefill, a one-token pass too)
            assert counted.ran == 3 + lengths.count(1)
            counted.off = True
            per_op = _decode(model, lengths)
    finally:
        torch.set_num_threads(before)
    for a, b in zip(fused, per_op):
        assert a.shape == (len(lengths), model.config.vocab_size)
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["invariant", Q8])
@pytest.mark.parametrize("lengths", [[5], [5, 9, 1, 30, 12, 7, 2, 20]])
def test_the_compiled_step_has_the_same_bits_at_any_thread_count(model, counted, lengths, mode):
    """The step's one parallel region shares each product's output groups, the attention's
    (query, head) pairs and the rows among its threads: its outputs are the same bits at 1, 2
    and 3 threads, and at 5 and 16, more threads than the tiny model has output groups in a
    product (4) or heads (4), and the logits equal the per-op path's at one thread. (The
    tiny model's head is a dense product, 266 rows: torch's, whose bits at 16 threads are not
    those at one, so at 16 the step's outputs are compared, not the logits.)"""
    before = torch.get_num_threads()
    runs, steps = {}, {}
    try:
        with kernel_mode(mode):
            for threads in (1, 2, 3, 5, 16):
                torch.set_num_threads(threads)
                counted.outs.clear()
                runs[threads] = _decode(model, lengths, seed=5)
                steps[threads] = list(counted.outs)
            assert counted.ran == 5 * (3 + lengths.count(1))
            counted.off = True
            torch.set_num_threads(1)
            per_op = _decode(model, lengths, seed=5)
    finally:
        torch.set_num_threads(before)
    for threads in runs:
        assert len(steps[threads]) == len(steps[1]) == 3 + lengths.count(1)
        assert all(torch.equal(a, b) for a, b in zip(steps[threads], steps[1])), f"{threads} threads"
        if threads < 16:
            assert all(torch.equal(a, b) for a, b in zip(runs[threads], per_op)), f"{threads} threads"


def test_a_failed_size_check_inside_the_parallel_region_returns_its_status(model):
    """A kernel that refuses (here a product whose inputs are not whole blocks) makes every
    thread of the step's region leave at the same point: the call returns the status, at 1
    and 2 threads, instead of hanging at a barrier."""
    import ctypes

    from tttr.engine.inference.kv_cache import KVCache

    plan = cdecode._plan(model)
    cfg = model.config
    bad = cdecode._Model.from_buffer_copy(plan.model)
    layers = (cdecode._Layer * cfg.n_layers).from_buffer_copy(
        (cdecode._Layer * cfg.n_layers).from_address(plan.model.layers))
    layers[cfg.n_layers - 1].gate_up.k = 33  # not a multiple of 32: tttr_qlinear_parts returns 1
    bad.layers = ctypes.addressof(layers)
    cache = KVCache(cfg.n_layers, 8, cfg.n_kv_heads, cfg.head_dim)
    k, v = cache.k, cache.v
    for threads in (1, 2):
        x = torch.randn(1, cfg.d_model)
        h = torch.empty_like(x)
        pos = torch.zeros(1, dtype=torch.int64)
        status = cdecode._library.load().tttr_decode(
            ctypes.addressof(bad), x.data_ptr(), h.data_ptr(), 1, pos.data_ptr(), pos.data_ptr(), pos.data_ptr(),
            k.data_ptr(), v.data_ptr(), k.stride(0), 0, k.stride(1), 1, k.shape[1], model._cos.data_ptr(),
            model._sin.data_ptr(), model._cos.shape[0], threads)
        assert status == 1


def test_under_q8_the_compiled_step_multiplies_with_8_bit_activations(model, counted):
    """`invariant-q8`'s compiled passes run kernels.cq8's products (one plan per product kind):
    close to `invariant`'s logits, not the same bits."""
    with kernel_mode("invariant"):
        fp32 = _decode(model, [4, 11, 2])
    with kernel_mode(Q8):
        q8 = _decode(model, [4, 11, 2])
    assert counted.ran == 2 * 3
    assert cdecode._plan(model, q8=True) is not cdecode._plan(model) is not None
    for a, b in zip(q8, fp32):
        assert not torch.equal(a, b)
        assert torch.allclose(a, b, atol=0.1 * float(b.abs().max()))


def test_a_lone_sequence_in_its_own_cache_runs_compiled_with_the_per_op_bits(model, counted):
    fused = _decode(model, [6], pooled=False)
    assert counted.ran == 3
    counted.off = True
    assert all(torch.equal(a, b) for a, b in zip(fused, _decode(model, [6], pooled=False)))


def test_a_row_has_the_same_bits_alone_and_in_any_batch(model, counted):
    """A sequence's logits in a batch equal its logits decoded alone, wherever it sits and
    whatever else shares the pass."""
    from tttr.engine.inference.kv_cache import KVCache, KVPool
    from tttr.engine.inference.model import Segment

    cfg = model.config
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g) for n in (4, 11, 7, 19, 2)]
    nxt = [int(t) for t in torch.randint(0, cfg.vocab_size, (5,), generator=g)]

    def step(order):
        caches = [KVCache(cfg.n_layers, 32, cfg.n_kv_heads, cfg.head_dim, allocate=False) for _ in order]
        KVPool(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim).arrange(caches)
        for c, i in zip(caches, order):
            n = len(prompts[i])
            model.forward(prompts[i], torch.arange(n), [Segment(0, n, c)])
            c.length = n
        logits = model.forward(torch.tensor([nxt[i] for i in order]), torch.tensor([c.length for c in caches]),
                               [Segment(r, r + 1, c) for r, c in enumerate(caches)])
        return {i: logits[r] for r, i in enumerate(order)}

    with kernel_mode("invariant"):
        alone = {i: step([i])[i] for i in range(5)}
        for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4], [3, 1]):
            for i, row in step(order).items():
                assert torch.equal(row, alone[i])
    assert counted.ran == 5 + 4


def test_a_model_with_dense_products_takes_the_per_op_path(tmp_path, counted):
    from tttr.engine.inference.model import load_model

    cfg = tiny_config("llama")
    dense = load_model(write_gguf(tmp_path / "tiny-f32.gguf", cfg, tiny_weights(cfg, seed=12)))
    assert cdecode._plan(dense) is None
    out = _decode(dense, [4, 9])
    assert counted.ran == 0 and all(torch.isfinite(o).all() for o in out)


def test_a_layer_field_the_compiled_step_does_not_run_sends_the_model_to_the_per_op_path(model):
    """A model whose layers hold something more (a family feature such as q/k norms) is not run
    compiled: the step would silently skip it."""
    import copy

    other = copy.copy(model)
    layer = other.layers[0]
    extended = type("Extended", (), {**{f: getattr(layer, f) for f in layer._fields},
                                     "_fields": layer._fields + ("future_norm",), "future_norm": torch.ones(4)})()
    other.layers = [extended] + model.layers[1:]
    assert cdecode._plan(other) is None
    assert cdecode._plan(model) is not None


def test_qwen3_q_k_norms_run_compiled_with_the_per_op_bits(tmp_path, counted):
    """Qwen3's RMSNorm of each query and key head (head dim 24, not d / heads) is run by the
    compiled step too: the same bits as the per-op path."""
    import copy

    import gguf

    from tests.test_engine_families import QWEN3, family_weights, write_family
    from tttr.engine.inference.model import load_model

    dense = load_model(write_family(tmp_path / "qwen3.gguf", QWEN3, family_weights(QWEN3)))

    def blocks(w):  # the product as a file storing it as Q8_0 would hold it
        return ops.block_weight("Q8_0", gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0))

    model = copy.copy(dense)
    model.layers = [w._replace(qkv=blocks(w.qkv), o=blocks(w.o), gate_up=blocks(w.gate_up), down=blocks(w.down))
                    for w in dense.layers]
    assert model.config.qk_norm and model.layers[0].q_norm is not None and cdecode._plan(model) is not None
    fused = _decode(model, [3, 8])
    assert counted.ran == 3
    counted.off = True
    assert all(torch.equal(a, b) for a, b in zip(fused, _decode(model, [3, 8])))


def test_replacing_a_models_layers_makes_a_new_plan(model, counted):
    """The plan reads the layers it was made from: a model whose layers list (or final norm) is
    replaced, as tests and tools do to swap weights, is planned again, not run with the old
    weights; an unchanged model keeps its plan."""
    first = cdecode._plan(model)
    assert first is not None and cdecode._plan(model) is first
    old = model.layers
    try:
        model.layers = list(old)
        again = cdecode._plan(model)
        assert again is not None and again is not first
    finally:
        model.layers = old


@pytest.mark.slow
def test_the_default_model_gives_the_same_tokens_and_digests_at_1_and_2_threads():
    """End to end on the default model (real engine, invariant kernels): a greedy stream and
    two sampled sequences decoded together give the same token ids and logits digests with
    the compiled step's one parallel region of 2 threads as with 1."""
    from tttr.engine.inference.loader import default_model_path
    from tttr.engine.inference.model import load_model
    from tttr.engine.inference.sampler import SamplingParams
    from tttr.engine.inference.scheduler import Engine
    from tttr.engine.inference.sequence import Sequence

    model = load_model(default_model_path())
    assert cdecode._plan(model) is not None  # its decode passes run the compiled step
    tok = model.tokenizer
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Write a haiku about debugging."}]))
    before = torch.get_num_threads()
    runs = {}
    try:
        with kernel_mode("invariant"):
            for threads in (1, 2):
                torch.set_num_threads(threads)
                engine = Engine(model)
                greedy = Sequence(ids, SamplingParams(temperature=0.0), 20, stop_token_ids=())
                engine.generate([greedy])
                sampled = [Sequence(ids, SamplingParams(temperature=0.8, seed=i), 10, stop_token_ids=()) for i in (1, 2)]
                engine.generate(sampled)
                runs[threads] = [[(r.token_id, r.digest) for r in s.records] for s in [greedy] + sampled]
    finally:
        torch.set_num_threads(before)
    assert [len(r) for r in runs[1]] == [20, 10, 10]
    assert runs[2] == runs[1]
