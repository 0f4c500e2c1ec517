"""Generation without torch: what `tttr generate` runs when it can, for a start in well under a
second (`import torch` alone is ~1.8 s and ~220 MiB here).

It applies to one sequence under the `invariant` kernels (or `invariant-q8`, where kernels.cq8
takes every product), on a GGUF model every product of
which runs from its blocks (kernels.cquant) with the compiled kernels built, greedy or
sampled at a temperature without top-k/top-p, when the model has loaded once through torch
on this machine (its rotary tables are read from that load, rope_cache.py). Elsewhere
`load` or `generate` returns None and the caller takes the torch path.

It gives the torch path's bits (the same tokens, logprobs, top-k and logits digests): the
same compiled kernels on the same values in the same order. The prompt is prefilled by one
call of the compiled decode step (kernels.cdecode's `tttr_decode`) with a row per prompt
token: that step writes every row's key and value before attention reads keys up to each
row's own position, so rows of one sequence at consecutive positions are a causal prefill,
the per-op path's arithmetic (block products, crow's norms, rotary and SwiGLU, cattention).
Each later token is a one-row call, as in the engine. The head is the block product, then
crow's log-softmax and top-k, numpy's argmax (greedy) or crow's softmax and draw (sampled):
what the scheduler and sampler call under `invariant`. Under `invariant-q8` the decode step's
plan and the head multiply with 8-bit activations (kernels.cq8), as that mode's ops do."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from tttr.engine.inference import rope_cache
from tttr.engine.inference.block_cache import BlockCache
from tttr.engine.inference.config import ModelConfig
from tttr.engine.inference.digest import logits_digests
from tttr.engine.inference.fingerprint import fingerprint_without_torch
from tttr.engine.inference.gguf_file import is_gguf, read_gguf
from tttr.engine.inference import layer_weights
from tttr.engine.inference.layer_weights import LayerWeights
from tttr.engine.inference.sampling import SamplingParams, uniform
from tttr.engine.inference.sequence import TOPK, TokenRecord
from tttr.engine.inference.tokenizer import Tokenizer
from tttr.kernels import array_ops
from tttr.kernels.array_ops import QuantWeight
from tttr.kernels.mode import Q8

MODES = ("invariant", Q8)  # the kernel modes this path runs (kernels.mode)


def threads() -> int:
    """The thread count the compiled kernels get (any count gives the same bits): $OMP_NUM_THREADS,
    else the CPUs this process may run on."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        return len(os.sched_getaffinity(0))


@dataclass(eq=False)
class LiteModel:
    """A GGUF model held as numpy arrays and blocks, as `Model` holds it (model.py)."""

    config: ModelConfig
    tokenizer: Tokenizer
    embed: QuantWeight
    lm_head: QuantWeight
    norm: np.ndarray
    layers: list[LayerWeights]
    scale: float
    cos: np.ndarray  # [rows, head_dim]: Model._cos
    sin: np.ndarray
    mode: str = "invariant"  # the kernel mode it runs (one of MODES)
    plan: object = None  # the compiled decode step's plan of this model (array_ops.decode_plan)

    def __post_init__(self) -> None:
        self.plan = array_ops.decode_plan(self, q8=self.mode == Q8)

    def fingerprint(self) -> dict:
        """What its arithmetic runs on, as `Model.fingerprint` says it for the engine (the
        same fields and values but torch's own, None here: fingerprint.py)."""
        return fingerprint_without_torch(threads())


def load(path: Path, mode: str = "invariant") -> LiteModel | None:
    """The model at `path` for the torch-free path under kernel mode `mode`, or None where that
    path does not apply."""
    if not (mode in MODES and path.is_file() and is_gguf(path) and array_ops.available()):
        return None
    g = read_gguf(path)
    cfg, arrays = g.config, g.arrays
    rows = min(cfg.context_length, rope_cache.TABLE_ROWS)
    tables = rope_cache.load_tables(rope_cache.table_key(cfg, arrays.get("rope_freqs"), rows))
    if tables is None or tables[0].shape != (rows, cfg.head_dim):
        return None

    cache = BlockCache(path, g.quantized)  # the packed blocks, mapped when an earlier start kept them
    blocks, norm = cache.weight, arrays.get
    embed = blocks(["model.embed_tokens.weight"])
    tied = cfg.tied_embeddings or ("lm_head.weight" not in g.quantized and "lm_head.weight" not in arrays)
    lm_head = embed if tied else blocks(["lm_head.weight"])
    final_norm = norm("model.norm.weight")
    if embed is None or lm_head is None or final_norm is None or embed.shape != (cfg.vocab_size, cfg.d_model):
        return None
    layers = []
    for i in range(cfg.n_layers):
        layer = layer_weights.from_checkpoint(f"model.layers.{i}.", cfg, norm=norm, product=blocks,
                                              bias=arrays.get, concat=np.concatenate)
        if any(getattr(layer, f) is None for f in ("input_norm", "qkv", "o", "post_attention_norm", "gate_up", "down")) \
                or cfg.qk_norm and (layer.q_norm is None or layer.k_norm is None):
            return None  # a tensor missing or stored dense: the torch path says which, or runs it
        layers.append(layer)
    if layers[0].qkv.shape != ((cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, cfg.d_model):
        return None
    cache.save()
    if mode == Q8 and not array_ops.q8_applies(layers, lm_head):
        return None  # a product cq8 does not take: the torch path multiplies it as the mode says
    return LiteModel(cfg, g.tokenizer, embed, lm_head, final_norm, layers, 1.0 / math.sqrt(cfg.head_dim), *tables,
                     mode=mode)


class _Cache:
    """One sequence's keys and values, [layers, capacity, KVH, D] each, as tttr_decode reads them."""

    def __init__(self, cfg: ModelConfig, capacity: int):
        shape = (cfg.n_layers, capacity, cfg.n_kv_heads, cfg.head_dim)
        self.k, self.v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        self.capacity = capacity
        self.length = 0


def _pass(model: LiteModel, cache: _Cache, tokens: list[int], n_threads: int) -> np.ndarray:
    """Feed `tokens` at the cache's next positions; returns the last row's logits [1, vocab]."""
    R = len(tokens)
    pos = np.arange(cache.length, cache.length + R, dtype=np.int64)
    h = array_ops.decode(model.plan, array_ops.embedding(model.embed, tokens), pos, cache.k, cache.v, model.cos,
                         model.sin, n_threads)
    cache.length += R
    return array_ops.linear(h[R - 1:], model.lm_head, n_threads, q8=model.mode == Q8)


def _draw(logits: np.ndarray, params: SamplingParams, step: int, position: int, n_threads: int) -> int:
    """The sampler's token for one row (sampler.sample_rows under `invariant`): greedy, the first
    maximum; else the softmax of logits / temperature and its inverse-CDF draw."""
    if params.greedy:
        return int(logits[0].argmax())
    probs = array_ops.softmax(logits / np.float32(params.temperature), n_threads)
    return array_ops.draw(probs, np.array([uniform(params.seed, step, position)]), n_threads)[0]


def generate(model: LiteModel, prompt_ids: list[int], sampling: SamplingParams, max_tokens: int,
             on_token: Callable[[TokenRecord], None] | None = None) -> list[TokenRecord] | None:
    """The records `Engine.generate` gives for Sequence(prompt_ids, sampling, max_tokens) under
    the model's kernel mode, on_token called with each; None (before any work) where this path
    does not apply: top-k/top-p sampling, an empty prompt, or a prompt and max_tokens past the
    context or the rotary table (the engine then finishes or refuses it)."""
    cfg = model.config
    capacity = len(prompt_ids) + max_tokens
    if sampling.top_k or sampling.top_p < 1.0 or not prompt_ids or max_tokens < 1 \
            or capacity > min(cfg.context_length, model.cos.shape[0]) \
            or not all(0 <= t < cfg.vocab_size for t in prompt_ids):
        return None
    n_threads = threads()
    stops = model.tokenizer.stop_token_ids
    cache = _Cache(cfg, capacity)
    records: list[TokenRecord] = []
    feed = list(prompt_ids)
    while True:
        logits = _pass(model, cache, feed, n_threads)
        logprobs = array_ops.log_softmax(logits, n_threads)
        top_v, top_i = array_ops.topk(logprobs, TOPK, n_threads)
        p = len(records)
        token = _draw(logits, sampling, 0, p, n_threads)
        R = len(feed)
        rec = TokenRecord(
            position=p, token_id=token, forced=False, logprob=float(logprobs[0, token]),
            topk=tuple(zip(top_i[0].tolist(), top_v[0].tolist())), digest=logits_digests(logits)[0], batch_rows=R,
            rows=tuple(range(R)), row=R - 1, kernel_mode=model.mode, rng=(sampling.seed, 0, p),
            text=model.tokenizer.token_text(token),
        )
        records.append(rec)
        if on_token is not None:
            on_token(rec)
        if token in stops or len(records) >= max_tokens:
            return records
        feed = [token]
