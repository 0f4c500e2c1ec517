"""Key/value caches: one per sequence, sized once at what the sequence can reach (prompt +
tokens still to generate, capped at the context), so decoding never reallocates.

A cache either owns its tensors or is a slot of a `KVPool`: the engine keeps the caches of
its running sequences as slots 0..n-1 of one pool, in running order, so a decode step can
write every sequence's new key with one indexed copy and attend over all of them through
one strided view instead of gathering each sequence's cache into a padded batch. Rows of a
pool slot past its cache's length are kept at zero: padded attention multiplies them by an
exact zero weight, and 0 * 0 cannot turn into NaN or flip a sign."""

from __future__ import annotations

import torch

KV_ALIGN = 64  # pool capacity is a multiple of this (the invariant attention's key block)


class KVCache:
    __slots__ = ("k", "v", "length", "capacity", "pool", "slot")

    def __init__(self, n_layers: int, capacity: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", *,
                 allocate: bool = True):
        shape = (n_layers, capacity, n_kv_heads, head_dim)
        # Unallocated caches get their storage when a pool places them (KVPool.arrange).
        self.k = torch.empty(shape, dtype=dtype, device=device) if allocate else None
        self.v = torch.empty(shape, dtype=dtype, device=device) if allocate else None
        self.length = 0  # positions [0, length) hold valid keys/values in every layer
        self.capacity = capacity
        self.pool: KVPool | None = None
        self.slot = -1

    def nbytes(self) -> int:
        return 0 if self.k is None else 2 * self.k.numel() * self.k.element_size()


class KVPool:
    """The running sequences' caches as slots of two tensors [layers, slots, capacity, KVH, D]."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self._dims = (n_layers, n_kv_heads, head_dim)
        self.dtype, self.device = dtype, torch.device(device)
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.caches: list[KVCache] = []  # slot i holds caches[i]

    @property
    def capacity(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    @property
    def slots(self) -> int:
        return 0 if self.k is None else self.k.shape[1]

    def arrange(self, caches: list[KVCache]) -> None:
        """Make `caches` slots 0..n-1 in this order, keeping their contents. Caches already in
        place are not touched; the others are copied in (from their own tensors, another slot,
        or nothing when new). The pool grows (and then copies every cache once) when the slots
        or the capacity do not suffice, or when a cache would move up, over one still to move."""
        if caches == self.caches:
            return
        n_layers, kvh, d = self._dims
        need = max(c.capacity for c in caches) if caches else 0
        need = -(-need // KV_ALIGN) * KV_ALIGN
        # Filling slots 0, 1, ... in turn is safe when no cache's source slot lies below its
        # new one (the running order only drops and appends, so that is the normal case).
        moves_up = any(c.pool is self and c.slot < i for i, c in enumerate(caches))
        if self.k is None or len(caches) > self.slots or need > self.capacity or moves_up:
            slots = max(len(caches), min(2 * self.slots, 64))  # joins one by one regrow rarely
            shape = (n_layers, slots, need, kvh, d)
            k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            v = torch.zeros(shape, dtype=self.dtype, device=self.device)
            for i, c in enumerate(caches):
                if c.length:
                    k[:, i, :c.length] = c.k[:, :c.length]
                    v[:, i, :c.length] = c.v[:, :c.length]
            self.k, self.v = k, v
            moved = range(len(caches))
        else:
            moved = []
            for i, c in enumerate(caches):
                if c.pool is self and c.slot == i:
                    continue
                ks, vs = self.k[:, i], self.v[:, i]
                if c.length:
                    ks[:, :c.length] = c.k[:, :c.length]
                    vs[:, :c.length] = c.v[:, :c.length]
                ks[:, c.length:].zero_()
                vs[:, c.length:].zero_()
                moved.append(i)
        for c in self.caches:
            if c.pool is self:
                c.pool, c.slot = None, -1
        for i in moved:
            self._bind(caches[i], i)
        for i, c in enumerate(caches):
            c.pool, c.slot = self, i
        self.caches = list(caches)

    def _bind(self, cache: KVCache, slot: int) -> None:
        cache.k = self.k[:, slot, :cache.capacity]
        cache.v = self.v[:, slot, :cache.capacity]

    def release(self) -> None:
        """Drop the storage (when nothing runs)."""
        for c in self.caches:
            if c.pool is self:
                c.pool, c.slot = None, -1
        self.k = self.v = None
        self.caches = []
