"""Keys and values of token prefixes the engine has already computed, for sequences that
start with them: such a sequence copies them into its cache and prefills only the rest.

An agent's step k prompt is its step k-1 prompt plus that step's message and the command's
output, and every step of every run of a task starts with the same system prompt and
examples; the experiments (triage, bisect) replay one recording many times with a few
values changed, so their live steps share long prefixes with each other. Reusing them is
sound only under the invariant kernels (`invariant`, `invariant-q8`: kernels.mode.is_invariant),
where the keys and values of a position do not depend on the rows they were computed with (a
whole prompt in one pass, or a few rows on top of a cache), so the engine consults the cache
for those sequences only, and a run's tokens and logits digests are the same with or without
it; what changes is the `batch` a position's logits record (fewer rows in its pass). The two
modes' keys and values are different bits, so each entry is kept under its mode and serves
sequences of that mode only.

Sources are the caches of sequences that finished (kept here, least recently used first
out, up to `max_bytes`) and of the sequences running beside the new one (read in place).
The engine holds none unless it is given one (`Engine.prefixes`)."""

from __future__ import annotations

import collections
from typing import Iterable

import torch

from tttr.engine.inference.kv_cache import KVCache
from tttr.kernels.mode import is_invariant

MIN_TOKENS = 16  # a shorter common prefix is not worth a copy


def common_prefix(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    def __init__(self, max_bytes: int = 256 << 20, min_tokens: int = MIN_TOKENS):
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        # (kernel mode, token ids) -> keys and values of those positions
        self._entries: collections.OrderedDict[tuple[str, tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]] = (
            collections.OrderedDict())
        self.bytes = 0
        self.hits = 0  # sequences that started from a reused prefix
        self.reused_tokens = 0  # positions they did not prefill

    def __len__(self) -> int:
        return len(self._entries)

    def keep(self, ids: list[int], cache: KVCache, mode: str = "invariant") -> None:
        """Keep the first `cache.length` positions of a finished sequence whose tokens are `ids`,
        computed under kernel mode `mode` (nothing is kept for a mode that is not invariant)."""
        n = cache.length
        if n < self.min_tokens or cache.k is None or not is_invariant(mode):
            return
        key = tuple(ids[:n])
        for m, other in self._entries:
            if m == mode and len(other) >= n and other[:n] == key:  # already covered
                self._entries.move_to_end((m, other))
                return
        for m, other in [e for e in self._entries if e[0] == mode and key[:len(e[1])] == e[1]]:  # covered by the new one
            self._drop((m, other))
        k, v = cache.k[:, :n].clone(), cache.v[:, :n].clone()
        self._entries[(mode, key)] = (k, v)
        self.bytes += _nbytes(k, v)
        while self.bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def fill(self, prompt_ids: list[int], cache: KVCache, running: Iterable[tuple[list[int], KVCache]] = (),
             mode: str = "invariant") -> int:
        """Copy the longest known prefix of `prompt_ids` (leaving its last token to compute,
        whose logits the sequence needs) kept under kernel mode `mode`, or held by a `running`
        sequence (of that mode, the caller's to ensure), into the new, empty `cache`; the
        positions copied (none for a mode that is not invariant)."""
        if not is_invariant(mode):
            return 0
        limit = len(prompt_ids) - 1
        best, src = 0, None
        for key, (k, v) in self._entries.items():
            if key[0] != mode:
                continue
            n = min(common_prefix(key[1], prompt_ids), limit)
            if n > best:
                best, src = n, (key, k, v)
        for ids, other in running:
            if other.k is None or other.length <= best:
                continue
            n = min(common_prefix(ids[:other.length], prompt_ids), limit)
            if n > best:
                best, src = n, (None, other.k, other.v)
        if best < self.min_tokens or src is None:
            return 0
        key, k, v = src
        if key is not None:
            self._entries.move_to_end(key)
        shape = (k.shape[0], cache.capacity, *k.shape[2:])
        cache.k = torch.empty(shape, dtype=k.dtype, device=k.device)
        cache.v = torch.empty(shape, dtype=v.dtype, device=v.device)
        cache.k[:, :best] = k[:, :best]
        cache.v[:, :best] = v[:, :best]
        cache.length = best
        self.hits += 1
        self.reused_tokens += best
        return best

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def _drop(self, key: tuple[str, tuple[int, ...]]) -> None:
        k, v = self._entries.pop(key)
        self.bytes -= _nbytes(k, v)


def _nbytes(k: torch.Tensor, v: torch.Tensor) -> int:
    return k.numel() * k.element_size() + v.numel() * v.element_size()
