"""Sampling parameters and the draw's randomness, without torch (the torch-free generation
path, engine/inference/lite.py, and the sampler both take them from here).

Randomness is counter-based: the uniform draw for (seed, rng_step, position) is a hash of
exactly those three numbers, never the state of a shared generator (see sampler.py)."""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass

from tttr.engine.errors import EngineError

SEED_LIMIT = 2**63


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    top_k: int = 0  # 0 = no limit
    seed: int = 0  # in [0, 2**63)

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise EngineError(f"temperature={t!r} is out of range: use a number >= 0 (0 = greedy)")
        p = self.top_p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not (0 < p <= 1):
            raise EngineError(f"top_p={p!r} is out of range: use a number in (0, 1]")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise EngineError(f"top_k={self.top_k!r} is out of range: use an integer >= 0 (0 = no limit)")
        s = self.seed
        if isinstance(s, bool) or not isinstance(s, int) or not (0 <= s < SEED_LIMIT):
            raise EngineError(f"seed={s!r} is out of range: use an integer in [0, 2**63)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_json(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}


def uniform(seed: int, step: int, position: int) -> float:
    """The draw for (seed, step, position): a double in [0, 1) from blake2b of the three numbers."""
    digest = hashlib.blake2b(struct.pack("<qqq", seed, step, position), digest_size=8,
                             person=b"tttr-rng").digest()
    return (int.from_bytes(digest, "little") >> 11) * (1.0 / (1 << 53))
