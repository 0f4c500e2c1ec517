"""Replay policy: for each layer, pin (take the recorded value) or free (compute it live).

Recording is the policy with every layer free and no source. Faithful replay pins all
three. Selective replay pins two and frees one. A fork is a replay with one mutation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tttr.sessions.errors import TTTRError
from tttr.sessions.vocabulary import RECORDED_LAYERS as LAYERS  # the layers a policy pins or frees


class PolicyError(TTTRError, ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Policy:
    free: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.free) - set(LAYERS))
        if unknown:
            raise PolicyError(
                f"unknown layer {', '.join(map(repr, unknown))} in --free: use tensor, token or trace"
            )
        object.__setattr__(self, "free", frozenset(self.free))

    @classmethod
    def record(cls) -> "Policy":
        return cls(frozenset(LAYERS))

    @classmethod
    def parse(cls, text: str | None) -> "Policy":
        """`tensor,token` -> those layers free; None or '' -> faithful (everything pinned)."""
        parts = [p.strip() for p in (text or "").split(",") if p.strip()]
        if not parts and text:  # ',' or ' ': a layer list gone wrong, not a wish for a faithful replay
            raise PolicyError(f"--free {text!r} names no layer: give tensor, token or trace, comma-separated "
                              "(or no --free for a faithful replay)")
        return cls(frozenset(parts))

    def pinned(self, layer: str) -> bool:
        return layer not in self.free

    @property
    def faithful(self) -> bool:
        return not self.free

    def describe(self) -> str:
        if not self.free:
            return "faithful (all layers pinned)"
        if self.free == frozenset(LAYERS):
            return "live (all layers free)"
        return "free " + ",".join(l for l in LAYERS if l in self.free)
