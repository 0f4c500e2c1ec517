"""One forward pass of the engine (scheduler.py): the rows it flattens, each sequence's part
of them, and what it produced."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from tttr.engine.inference.model import Segment
from tttr.engine.inference.sequence import Sequence


class Planned(NamedTuple):
    """One sequence's part of a pass. A sequence that shares another's rows (a follower: its
    twin, or the same fresh prompt) carries its leader's rows and logits rows."""

    seq: Sequence
    fut: Future
    start: int  # its rows of the pass: [start, end)
    end: int
    first_out: int  # its first row of the pass's logits
    n_out: int  # positions it produces: from the last n_out of its rows


@dataclass(slots=True)
class Pass:
    """One forward pass being planned: its flattened rows, and each sequence's part."""

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    logit_rows: list[int] = field(default_factory=list)  # the rows whose logits are produced
    parts: list[Planned] = field(default_factory=list)
    followers: list[tuple[Sequence, Planned]] = field(default_factory=list)  # (sequence, its leader's part)
    computed: list[tuple[tuple, Planned]] = field(default_factory=list)  # (twin key, part) of computed parts

    def add(self, seq: Sequence, fut: Future, feed: list[int], n_out: int) -> Planned:
        """Rows for `seq` to compute `feed` (its positions after its cache), the last n_out producing."""
        start, p0 = len(self.tokens), seq.cache.length
        self.tokens.extend(feed)
        self.positions.extend(range(p0, p0 + len(feed)))
        end = len(self.tokens)
        self.segments.append(Segment(start, end, seq.cache))
        first_out = len(self.logit_rows)
        self.logit_rows.extend(range(end - n_out, end))
        self.parts.append(Planned(seq, fut, start, end, first_out, n_out))
        return self.parts[-1]


@dataclass(frozen=True, slots=True)
class PassOutput:
    """What one forward pass produced, per logits row i (a `Planned`'s first_out + j)."""

    logits: torch.Tensor  # fp32 [rows produced, vocab]
    logprobs: torch.Tensor  # [rows produced, vocab]
    top_v: list[list[float]]  # the top-k logprobs of row i
    top_i: list[list[int]]  # and their token ids
    digests: list[str]
    drawn: dict[tuple[int, int], int]  # (id(seq), j) -> the sampled token (see Engine._draw)
    batch_rows: int  # rows in the pass
    mode: str  # its kernel mode
