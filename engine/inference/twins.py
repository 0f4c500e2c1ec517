"""Twins: running sequences whose caches hold the same token ids and that feed the same
tokens in a pass. Under batch-invariant kernels a row's bits depend only on the ids before it
(not on the batch, nor on how the prompt was split into passes), so twins get the same keys,
values and logits: the engine computes the first of them (the leader) and the others copy its
rows (scheduler.Engine._step).

Finding twins costs O(1) per sequence per pass: each sequence keeps a rolling hash of the ids
its cache holds, brought up to date with the ids fed since the last pass, so a pass's key is
(cache length, that hash, this pass's feed). A hash is only a hint: a hit is confirmed by
comparing the ids, and a follower remembers up to where it already matched its leader, so a
pair that keeps sharing compares only what it fed since.

Twins rarely join in the same pass (the replays of a bisect round reach the model a moment
apart), so the engine also remembers what each key computed over the last `LAG` passes: a
twin that is behind takes those rows instead of computing them, and so catches up."""

from __future__ import annotations

import collections
import weakref
from typing import Any, NamedTuple

from tttr.engine.inference.sequence import Sequence

_MOD = (1 << 61) - 1  # a Mersenne prime: a polynomial hash over it collides about never
_BASE = 1_000_003
LAG = 8  # passes a computed key is remembered for: how far behind a twin can be and catch up


class TwinKey(NamedTuple):
    """What two sequences share when their passes can be one: the ids in the cache (their
    count and hash), the tokens fed now and how many positions the last of them produce."""

    fed: int
    fed_hash: int
    feed: tuple[int, ...]
    n_out: int


class _Fed:
    __slots__ = ("hash", "length", "matched", "matched_upto")

    def __init__(self) -> None:
        self.hash = 0  # of ids[:length]
        self.length = 0
        self.matched: weakref.ref | None = None  # the sequence whose ids equal ours ...
        self.matched_upto = 0  # ... up to here


class Twins:
    def __init__(self) -> None:
        # sequences are submitted once and leave by being dropped: weak keys clean up after them
        self._fed: weakref.WeakKeyDictionary[Sequence, _Fed] = weakref.WeakKeyDictionary()
        self._recent: dict[TwinKey, tuple[int, Any]] = {}  # key -> (the pass that computed it, what it gave)
        self._order: collections.deque[tuple[int, TwinKey]] = collections.deque()

    def key(self, seq: Sequence, feed: list[int], n_out: int) -> TwinKey:
        """`seq`'s key for a pass feeding `feed` (after its cache's ids)."""
        st = self._fed.get(seq)
        if st is None:
            st = self._fed[seq] = _Fed()
        fed = seq.cache.length
        if st.length > fed:  # a cache only grows; start over should one ever be rebuilt
            st.hash = st.length = 0
        h = st.hash
        for t in seq.ids[st.length:fed]:
            h = (h * _BASE + t + 1) % _MOD
        st.hash, st.length = h, fed
        return TwinKey(fed, h, tuple(feed), n_out)

    def same_history(self, seq: Sequence, leader: Sequence) -> bool:
        """Whether the ids in `seq`'s cache equal those in `leader`'s (their keys matched).
        On True, `seq` remembers the match, together with the feed they share this pass."""
        fed = seq.cache.length
        st = self._fed[seq]
        start = st.matched_upto if st.matched is not None and st.matched() is leader else 0
        start = min(start, fed)
        if seq.ids[start:fed] != leader.ids[start:fed]:
            return False
        st.matched = weakref.ref(leader)
        st.matched_upto = fed  # the shared feed is compared by the key itself; its ids join next pass
        return True

    def remember(self, key: TwinKey, computed: Any, step: int) -> None:
        """What pass `step` computed for `key`, for twins still behind (kept LAG passes)."""
        self._recent[key] = (step, computed)
        self._order.append((step, key))
        while self._order and self._order[0][0] <= step - LAG:
            old, k = self._order.popleft()
            if self._recent.get(k, (None,))[0] == old:
                del self._recent[k]

    def recall(self, key: TwinKey) -> Any | None:
        hit = self._recent.get(key)
        return None if hit is None else hit[1]

    def forget(self) -> None:
        """Drop what recent passes computed (nothing runs: their memory goes now)."""
        self._recent.clear()
        self._order.clear()
