"""The logits digest: a check that two computations gave the same bits, recorded per position
and named in the run fingerprint."""

from __future__ import annotations

import torch
import xxhash

LOGITS_DIGEST = "xxh3-128"  # recorded in the run fingerprint (blake2b-128 before kernels revision 2)


def logits_digests(logits: torch.Tensor) -> list[str]:
    """xxh3-128 hex of each row's fp32 logits bytes (native byte order), logits [n, vocab]:
    ~10 GB/s (blake2b took a quarter millisecond a row)."""
    return [xxhash.xxh3_128_hexdigest(r) for r in logits.detach().to(torch.float32).contiguous().numpy()]


def logits_digest(row: torch.Tensor) -> str:
    """`logits_digests` of one position's logits [vocab]."""
    return logits_digests(row.reshape(1, -1))[0]
