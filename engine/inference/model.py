"""The Llama-family decoder (Llama 2/3.x, SmolLM2, Qwen2/2.5, Qwen3): RMSNorm, RoPE (with
Llama 3's frequency scaling), grouped-query attention (Qwen2's q/k/v biases, Qwen3's per-head
q/k RMSNorm), SwiGLU, tied or untied head. Every reduction goes through `kernels.ops`, so the kernel mode
decides the arithmetic; everything else here is row-local (embedding lookup, rotary, SiLU,
residual adds).

One forward pass takes the rows of many sequences flattened into one [rows, d] tensor: the
linears see all rows at once, attention runs per sequence against that sequence's cache.
Q/K/V and gate/up are fused into one linear each so a layer is four matrix products."""

from __future__ import annotations

import math
from functools import partial
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch

from tttr.engine.inference.block_cache import BlockCache
from tttr.engine.inference.checkpoint import Checkpoint
from tttr.engine.inference.config import ModelConfig
from tttr.engine.errors import EngineError
from tttr.engine.inference.fingerprint import fingerprint
from tttr.engine.inference.kv_cache import KV_ALIGN, KVCache
from tttr.engine.inference import layer_weights
from tttr.engine.inference.layer_weights import LayerWeights
from tttr.engine.inference import rope_cache
from tttr.engine.inference.loader import load_checkpoint
from tttr.engine.inference.model_id import model_id as compute_model_id
from tttr.engine.inference.tokenizer import Tokenizer
from tttr.kernels import ops


@dataclass(frozen=True, slots=True)
class Segment:
    """One sequence's rows in a pass: rows [start, end) hold its positions
    [cache.length, cache.length + end - start); the pass writes their keys/values there."""

    start: int
    end: int
    cache: KVCache


class _Span(NamedTuple):
    """A segment as one pass sees it: rows [start, end) write cache positions
    [cache_start, cache_end); `positions` are those rows' positions."""

    start: int
    end: int
    cache: KVCache
    cache_start: int
    cache_end: int
    positions: torch.Tensor  # int64 [end - start]


def _inv_freq(config: ModelConfig, freq_factors: torch.Tensor | None) -> torch.Tensor:
    d = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    rs = config.rope_scaling
    if freq_factors is not None:  # GGUF rope_freqs: per-frequency divisors (Llama 3.x from llama.cpp's converter)
        if tuple(freq_factors.shape) != (d // 2,):
            raise EngineError(f"rope_freqs has shape {tuple(freq_factors.shape)}: expected ({d // 2},), half the head size")
        inv = inv / freq_factors.float()
    elif rs is not None and rs.kind == "llama3":  # the same scaling from its parameters
        factor, low, high, orig = rs.factor, rs.low_freq_factor, rs.high_freq_factor, rs.original_context
        low_wl, high_wl = orig / low, orig / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (orig / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        mid = (wavelen >= high_wl) & (wavelen <= low_wl)
        inv = torch.where(mid, smoothed, scaled)
    if rs is not None and rs.kind == "linear":
        inv = inv / rs.factor
    return inv


class Model:
    """Weights, tokenizer, identity. `forward` is the only compute entry point."""

    def __init__(self, checkpoint: Checkpoint, model_id: str, dtype: torch.dtype = torch.float32):
        cfg = checkpoint.config
        self.config = cfg
        self.tokenizer: Tokenizer = checkpoint.tokenizer
        self.model_id = model_id
        self.name = checkpoint.name
        self.path: Path = checkpoint.path
        self.dtype = dtype
        self.device = torch.device("cpu")
        # Weights the file stores in a block type (ops.QUANT_FORMATS) stay blocks when the
        # compiled kernel can run their products (ops.block_weights: the same values, a fifth of
        # the bytes, and no fp32 copy); the rest, and all of them without the kernel, are dense.
        blocks = checkpoint.quantized if dtype == torch.float32 else {}
        self.block_weights = 0  # products that run from blocks
        # The packed blocks of a GGUF file as the torch-free path keeps them (block_cache.py):
        # mapped when an earlier start packed them, packed now and kept otherwise (same values).
        cache = BlockCache.for_file(checkpoint.path, blocks) if blocks and ops.blocks_available() else None

        def take(name: str, optional: bool = False) -> torch.Tensor | None:
            if name not in checkpoint:
                if optional:
                    return None
                raise EngineError(f"model {checkpoint.name!r} lacks tensor {name!r}: not a complete Llama-family checkpoint")
            return checkpoint.dense(name).to(dtype).contiguous()

        def weight(names: list[str], product: bool = True) -> torch.Tensor | ops.QuantWeight:
            """The weight made of `names`' rows: blocks when all are stored as blocks that fit the
            kernel, each part in its own type (a q/k/v of Q4_K, Q4_K and Q6_K is one product)."""
            parts = [blocks.get(n) for n in names]
            if all(p is not None for p in parts):
                qw = cache.weight(names) if cache is not None else ops.block_weights(parts)
                if qw is not None:
                    self.block_weights += product
                    return qw
            dense = [take(n) for n in names]
            return dense[0] if len(dense) == 1 else torch.cat(dense).contiguous()

        tied = cfg.tied_embeddings or "lm_head.weight" not in checkpoint
        self.embed = weight(["model.embed_tokens.weight"], product=tied)
        self.lm_head = self.embed if tied else weight(["lm_head.weight"])
        if tuple(self.embed.shape) != (cfg.vocab_size, cfg.d_model):
            raise EngineError(f"embedding shape {tuple(self.embed.shape)} does not match vocab {cfg.vocab_size} x d {cfg.d_model}")
        self.norm = take("model.norm.weight")
        self.layers: list[LayerWeights] = []
        for i in range(cfg.n_layers):
            self.layers.append(layer_weights.from_checkpoint(
                f"model.layers.{i}.", cfg, norm=take, product=weight, bias=partial(take, optional=True),
                concat=lambda parts: torch.cat(parts).contiguous()))
        expect = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        if tuple(self.layers[0].qkv.shape) != (expect, cfg.d_model):
            raise EngineError(f"attention weights {tuple(self.layers[0].qkv.shape)} do not match the config's heads")
        if cache is not None:
            cache.save()
        self._inv_freq = _inv_freq(cfg, checkpoint.tensors.get("rope_freqs"))
        self._cos = self._sin = torch.empty(0)
        self._rope_table(min(cfg.context_length, rope_cache.TABLE_ROWS))
        if dtype == torch.float32:  # kept for the torch-free path, which cannot compute these bits (rope_cache.py)
            freqs = checkpoint.tensors.get("rope_freqs")
            rope_cache.store_tables(rope_cache.table_key(cfg, None if freqs is None else freqs.numpy(), self._cos.shape[0]),
                                    self._cos.numpy(), self._sin.numpy())
        self.scale = 1.0 / math.sqrt(cfg.head_dim)

    # -- rotary --------------------------------------------------------------------------
    def _rope_table(self, n: int) -> None:
        freqs = torch.arange(n, dtype=torch.int64).float()[:, None] * self._inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        half = self.config.head_dim // 2
        self._cos = emb.cos().to(self.dtype).contiguous().to(self.device)
        sin = emb.sin().to(self.dtype)
        # rotate_half(x) * sin == roll(x, half) * [-sin, sin]: one roll instead of slice/neg/cat.
        self._sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).contiguous().to(self.device)

    def fingerprint(self) -> dict:
        return fingerprint(self.device, self.dtype)

    def new_cache(self, capacity: int) -> KVCache:
        c = self.config
        return KVCache(c.n_layers, capacity, c.n_kv_heads, c.head_dim, self.dtype, self.device)

    # -- compute -------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, segments: list[Segment],
                logit_rows: torch.Tensor | None = None) -> torch.Tensor:
        """tokens, positions: int64 [R]. Returns fp32 logits [len(logit_rows) or R, vocab].
        Each segment's keys/values are written to its cache before attention reads them;
        the caller advances `cache.length` afterwards."""
        cfg = self.config
        if self.device.type != "cpu":  # a copy on an accelerator (device.py): the scheduler's indices are CPU tensors
            tokens, positions = tokens.to(self.device), positions.to(self.device)
            logit_rows = None if logit_rows is None else logit_rows.to(self.device)
        R = tokens.shape[0]
        H, KVH, hd, eps = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rms_eps
        nqk = H + KVH
        need = int(positions.max()) + 1
        if need > self._cos.shape[0]:
            self._rope_table(max(need, min(cfg.context_length, 2 * self._cos.shape[0])))
        if R == len(segments):  # every row decodes one token: all layers in one compiled call when it applies
            h = ops.decode_layers(self, ops.embedding(self.embed, tokens).contiguous(), positions, segments)
            if h is not None:
                return ops.linear(h if logit_rows is None else h.index_select(0, logit_rows), self.lm_head).float()
        spans = [_Span(s.start, s.end, s.cache, s.cache.length, s.cache.length + s.end - s.start,
                       positions[s.start:s.end]) for s in segments]
        # Sequences that decode one token each share one attention call per layer (row i of
        # ops.decode_attention equals ops.attention on that sequence alone); the rest run
        # per sequence.
        # A lone decoder in a KV pool takes the same path: attention reads the pool's
        # zero-padded rows directly instead of padding a copy of its keys.
        dec = [sp for sp in spans if sp.end - sp.start == 1]
        batch = _DecodeBatch(dec, R) if len(dec) > 1 or (dec and dec[0].cache.pool is not None) else None
        rest = [sp for sp in spans if batch is None or sp.end - sp.start != 1]
        if batch is not None and rest:
            rest_rows = torch.cat([torch.arange(sp.start, sp.end, device=tokens.device) for sp in rest])
        linear, rms_norm, add_rms_norm, attention, scale = ops.linear, ops.rms_norm, ops.add_rms_norm, ops.attention, self.scale
        n_layers = len(self.layers)

        x = ops.embedding(self.embed, tokens)
        h = rms_norm(x, self.layers[0].input_norm, eps)
        for li, layer in enumerate(self.layers):
            qkv = linear(h, layer.qkv, layer.qkv_bias).view(R, nqk + KVH, hd)
            if layer.q_norm is not None:  # Qwen3: each query and key head normalized before the rotary
                qkv[:, :H] = rms_norm(qkv[:, :H].contiguous(), layer.q_norm, eps)
                qkv[:, H:nqk] = rms_norm(qkv[:, H:nqk].contiguous(), layer.k_norm, eps)
            qk = ops.rope(qkv, nqk, self._cos, self._sin, positions)
            q, k, v = qk[:, :H], qk[:, H:], qkv[:, nqk:]
            outs = []
            for sp in rest:
                kc, vc = sp.cache.k[li], sp.cache.v[li]
                kc[sp.cache_start:sp.cache_end] = k[sp.start:sp.end]
                vc[sp.cache_start:sp.cache_end] = v[sp.start:sp.end]
                outs.append(attention(q[sp.start:sp.end], kc[:sp.cache_end], vc[:sp.cache_end], sp.positions, scale))
            if batch is None:
                attn = outs[0] if len(outs) == 1 else torch.cat(outs)
            elif not rest:
                attn = batch.attend(li, q, k, v, scale)
            else:
                attn = q.new_empty(q.shape)
                attn[batch.rows] = batch.attend(li, q, k, v, scale)
                attn[rest_rows] = torch.cat(outs)
            h = add_rms_norm(x, linear(attn.reshape(R, H * hd), layer.o), layer.post_attention_norm, eps)
            down = linear(ops.swiglu(linear(h, layer.gate_up)), layer.down)
            # the residual add, and the next layer's input norm (the last layer's is the final norm)
            h = add_rms_norm(x, down, self.layers[li + 1].input_norm if li + 1 < n_layers else self.norm, eps)
        if logit_rows is not None:
            h = h.index_select(0, logit_rows)
        return linear(h, self.lm_head).float().cpu()  # the sampler and the records read CPU logits


class _DecodeBatch:
    """The one-token (decode) segments of a pass, attended together in each layer.

    When their caches are slots of one KVPool, the new keys/values of all of them are
    written with one indexed copy and attention reads the pool through a view (a gather
    only when the slots are not consecutive); caches of their own are gathered into a
    zero-padded batch."""

    def __init__(self, dec: list[_Span], n_rows: int):
        self.dec = dec
        self.all_rows = len(dec) == n_rows
        caches = [sp.cache for sp in dec]
        device = caches[0].k.device if caches[0].k is not None else caches[0].pool.k.device
        self.rows = torch.tensor([sp.start for sp in dec], dtype=torch.int64, device=device)
        self.positions = torch.tensor([sp.cache_start for sp in dec], dtype=torch.int64, device=device)
        pool = caches[0].pool
        self.pool = pool if pool is not None and all(c.pool is pool for c in caches) else None
        # keys read: up to the furthest position, rounded up to a whole attention block
        self.span = -(-(int(self.positions.max()) + 1) // KV_ALIGN) * KV_ALIGN
        if self.pool is not None:
            slots = [c.slot for c in caches]
            self.slots = torch.tensor(slots, dtype=torch.int64, device=device)
            self.first = slots[0] if slots == list(range(slots[0], slots[0] + len(slots))) else None
            self.flat = self.slots * self.pool.capacity + self.positions  # row in [slots * cap]

    def attend(self, li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        if not self.all_rows:
            q, k, v = q[self.rows], k[self.rows], v[self.rows]
        pool = self.pool
        if pool is not None:
            kp, vp = pool.k[li], pool.v[li]  # [slots, capacity, KVH, D]
            kp.view(-1, *kp.shape[2:]).index_copy_(0, self.flat, k)
            vp.view(-1, *vp.shape[2:]).index_copy_(0, self.flat, v)
            span = min(self.span, pool.capacity)
            if self.first is not None:
                n = len(self.dec)
                kb, vb = kp[self.first:self.first + n, :span], vp[self.first:self.first + n, :span]
            else:
                kb, vb = kp[:, :span].index_select(0, self.slots), vp[:, :span].index_select(0, self.slots)
        else:
            kb = k.new_zeros(len(self.dec), self.span, *k.shape[1:])
            vb = torch.zeros_like(kb)
            for i, sp in enumerate(self.dec):
                kc, vc = sp.cache.k[li], sp.cache.v[li]
                kc[sp.cache_start] = k[i]
                vc[sp.cache_start] = v[i]
                kb[i, :sp.cache_end] = kc[:sp.cache_end]
                vb[i, :sp.cache_end] = vc[:sp.cache_end]
        return ops.decode_attention(q, kb, vb, self.positions, scale)


def load_model(path: str | os.PathLike | None = None, dtype: torch.dtype = torch.float32) -> Model:
    """Resolution: `path`, then TTTR_MODEL, then the embedded default (see engine.loader)."""
    ckpt = load_checkpoint(path)
    return Model(ckpt, compute_model_id(ckpt.path, ckpt.name), dtype=dtype)
