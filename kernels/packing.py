"""Weights packed once for MKL's GEMM, shared by both kernel modes.

`torch.ops.mkl._mkl_linear` multiplies by a weight that `_mkl_reorder_linear_weight` laid
out in advance for a panel of `PACK_ROWS` rows (what PyTorch's own compiler emits for a
frozen CPU linear). Stock `F.linear` re-packs the weight inside every call once a product
has more than one row, which at decode sizes (1 to 32 rows) costs more than the product:
packed, an 8-row step of the default model is about twice as fast. The packed copy is made
on first use and dropped with the weight."""

from __future__ import annotations

import threading
import weakref

import torch

PACK_ROWS = 8  # the row panel MKL packs the weight for
HAS_MKL_PACK = torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


def mkl_linear(x2: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """[M, K] @ weight[N, K]^T through the packed copy; x2 contiguous fp32, M >= 1."""
    return torch.ops.mkl._mkl_linear(x2, packed, weight, None, x2.shape[0])


class WeightCache:
    """A value computed once per weight tensor, keyed by identity and version: a weight
    changed in place (its `_version` moves) is recomputed, a freed one is forgotten.
    `entries` is public so the hot path can look up without a call."""

    def __init__(self, make) -> None:
        self._make = make
        self.entries: dict[int, tuple[weakref.ref, int, object]] = {}
        self._lock = threading.Lock()

    def get(self, weight: torch.Tensor):
        entry = self.entries.get(id(weight))
        if entry is not None and entry[0]() is weight and entry[1] == weight._version:
            return entry[2]
        with self._lock:
            key = id(weight)
            entry = self.entries.get(key)
            if entry is None or entry[0]() is not weight or entry[1] != weight._version:
                ref = weakref.ref(weight, lambda _r, k=key: self.entries.pop(k, None))
                entry = self.entries[key] = (ref, weight._version, self._make(weight))
            return entry[2]


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkl._mkl_reorder_linear_weight(weight, PACK_ROWS)


packed_weights = WeightCache(_pack)


def packed(weight: torch.Tensor) -> torch.Tensor:
    """The packed copy of a contiguous fp32 [N, K] weight (needs HAS_MKL_PACK)."""
    return packed_weights.get(weight)
