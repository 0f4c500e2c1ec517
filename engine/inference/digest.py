"""The logits digest: a check that two computations gave the same bits, recorded per position
and named in the run fingerprint."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import xxhash

if TYPE_CHECKING:
    import torch

LOGITS_DIGEST = "xxh3-128"  # recorded in the run fingerprint (blake2b-128 before kernels revision 2)


def logits_digests(logits: torch.Tensor | np.ndarray) -> list[str]:
    """xxh3-128 hex of each row's fp32 logits bytes (native byte order), logits [n, vocab]
    (a tensor, or a numpy array: the torch-free path's): ~10 GB/s (blake2b took a quarter
    millisecond a row)."""
    if not isinstance(logits, np.ndarray):
        logits = logits.detach().float().numpy()
    return [xxhash.xxh3_128_hexdigest(r) for r in np.ascontiguousarray(logits, dtype=np.float32)]


def logits_digest(row: torch.Tensor) -> str:
    """`logits_digests` of one position's logits [vocab]."""
    return logits_digests(row.reshape(1, -1))[0]
