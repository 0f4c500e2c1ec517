"""Per-sequence key/value cache, allocated once at the size the sequence can reach
(prompt + tokens still to generate, capped at the context), so decoding never reallocates."""

from __future__ import annotations

import torch


class KVCache:
    __slots__ = ("k", "v", "length", "capacity")

    def __init__(self, n_layers: int, capacity: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.k = torch.empty(n_layers, capacity, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.empty(n_layers, capacity, n_kv_heads, head_dim, dtype=dtype, device=device)
        self.length = 0  # positions [0, length) hold valid keys/values in every layer
        self.capacity = capacity

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
