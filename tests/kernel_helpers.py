"""What the block-product tests share (test_kernels_blocks, _kquants, _q8): random GGUF weights
with gguf's values for them, the batch/place/thread invariance check every product must pass,
each compiled instruction-set body of a kernel source, and a model's dense copy."""

from __future__ import annotations

import copy
import ctypes
from collections.abc import Callable
from types import ModuleType

import gguf
import numpy as np
import torch

from tttr.kernels import ops
from tttr.sessions.cache import _cpu_flags, build_shared
from tests.engine_tiny import random_blocks


def random_weight(fmt: str, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random valid GGUF rows of `fmt` ([n, k] weights) and gguf's fp32 values for them."""
    raw = random_blocks(fmt, n, k, np.random.default_rng(seed))
    values = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[fmt]), dtype=np.float32)
    return raw, values.copy()


def assert_rows_invariant(linear: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> None:
    """Each row of linear(x) is the same bits whatever batch it is in, wherever it sits in the
    batch (every length, at the start, middle and end; shuffled) and at 1, 2 and 3 threads."""
    full = linear(x)
    m = x.shape[0]
    for rows in range(1, m + 1):
        for start in sorted({0, (m - rows) // 2, m - rows}):
            assert torch.equal(linear(x[start:start + rows]), full[start:start + rows]), (rows, start)
    shuffled = torch.randperm(m)
    assert torch.equal(linear(x[shuffled]), full[shuffled])
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert torch.equal(linear(x), full), f"{n} threads"
    finally:
        torch.set_num_threads(threads)


def compiled_bodies(kernel: ModuleType, stem: str, name_symbol: str, avx512: bool = True) -> dict[str, ctypes.CDLL]:
    """`kernel.SOURCE` built as each instruction-set body this CPU can run, the others switched off:
    the plain C one, AVX2 and (with `avx512`) AVX-512; each library declared by `kernel._declare`
    and checked to name its body through `name_symbol`."""
    flags = _cpu_flags().split()
    variants = {"c": ["-mno-avx512f", "-mno-avx2"]}
    if "avx2" in flags and "fma" in flags:
        variants["avx2"] = ["-mno-avx512f"]
    if avx512 and "avx512f" in flags:
        variants["avx512"] = []
    libs = {}
    for name, extra in variants.items():
        path, why = build_shared(f"{stem}-test-{name}", kernel.SOURCE, kernel._FLAGS + extra, "a test build",
                                 subdir="kernels")
        assert path is not None, why
        lib = ctypes.CDLL(str(path))
        kernel._declare(lib)
        assert getattr(lib, name_symbol)().decode() == name
        libs[name] = lib
    return libs


def dense_copy(model):
    """The same model with every block weight expanded to fp32 (ops.dense): the dense path."""
    dense = copy.copy(model)
    dense.layers = [layer._replace(**{f: ops.dense(getattr(layer, f)) for f in ("qkv", "o", "gate_up", "down")})
                    for layer in model.layers]
    dense.embed, dense.lm_head = ops.dense(model.embed), ops.dense(model.lm_head)
    return dense


def greedy_among_others(model, mode: str, target: list[int], compositions, seed: int) -> tuple[set, set]:
    """`target`'s 6 greedy tokens from one engine in kernel `mode`, generated once per composition
    (how many random other sequences share the batch, `target`'s place among them, the thread
    count): the distinct (token id, logits digest) sequences it got, and the distinct batch
    layouts (rows in the pass, its row) of its first pass, so a test can see they differed."""
    import random

    from tttr.engine.inference.sampler import SamplingParams
    from tttr.engine.inference.scheduler import Engine
    from tttr.engine.inference.sequence import Sequence

    rng = random.Random(seed)
    results, layouts = set(), set()
    before = torch.get_num_threads()
    try:
        with Engine(model, kernel_mode=mode, max_running=16) as eng:
            for n_others, at, threads in compositions:
                torch.set_num_threads(threads)
                seqs = [Sequence([rng.randrange(100, 40000) for _ in range(rng.randint(2, 20))], SamplingParams(),
                                 rng.randint(1, 6), stop_token_ids=()) for _ in range(n_others)]
                me = Sequence(target, SamplingParams(), 6, stop_token_ids=())
                seqs.insert(at, me)
                eng.generate(seqs)
                results.add(tuple((r.token_id, r.digest) for r in me.records))
                layouts.add((me.records[0].batch_rows, me.records[0].row))
                assert all(r.kernel_mode == mode for r in me.records)
    finally:
        torch.set_num_threads(before)
    return results, layouts
