"""The recording a replay or fork reads from, indexed by site."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

from tttr.sessions.errors import TTTRError
from tttr.sessions.records import Outcome
from tttr.sessions.vocabulary import canonical_site


class OracleError(TTTRError, RuntimeError):
    """A recording that does not support what the replay reached: a missing site or
    snapshot, a mutation whose context differs, a fork prefix that drifted."""


class Source:
    """A recording being replayed: its events by site, its tokens and logits by step, and
    the snapshot manifest of every tree it recorded."""

    def __init__(self, store, run_id: int):
        self.store = store
        # Every event decoded and checked: an unreadable one refuses the run here, in one
        # line naming the run and site, before anything is written.
        self.run, self.events = store.load_run(run_id)
        self.by_site = {e.site: e for e in self.events}
        self.tokens: dict[int, list[dict]] = {}
        self.logits: dict[int, list[dict]] = {}
        self.manifests: dict[str, str] = {}
        for e in self.events:
            if e.kind == "token":
                self.tokens.setdefault(e.step, []).append(e.value)
            elif e.kind == "logits":
                self.logits.setdefault(e.step, []).append(e.value)
            elif e.kind in ("setup", "tool") and isinstance(e.value, dict):
                tree = e.value.get("tree_after") or e.value.get("tree")
                if tree and e.value.get("snapshot"):
                    self.manifests[tree] = e.value["snapshot"]

    def on(self, store) -> Source:
        """This recording read through `store`, another connection to the same file (the one
        a checked plan acts on, opened for writing), without decoding it again. The run must
        still be the one decoded: deleted or replaced since, it is refused in one line, before
        anything is written."""
        from tttr.engine.replay.result import ReplayError

        rid = self.run.id
        now = store.run(rid)  # StoreError naming the file and its runs when it is gone
        decoded = self.events[-1].seq + 1 if self.events else 0  # seqs are dense
        # The same row (a new name aside) and as many events: the run decoded, not another under its id.
        if replace(now, name=None) != replace(self.run, name=None) or store.count_events(rid) != decoded:
            raise ReplayError(f"run {rid} in {store.path} changed after it was checked (deleted and "
                              "recorded again?): run the command again")
        moved = copy.copy(self)
        moved.store = store
        return moved

    def value(self, site: str) -> Any:
        e = self.by_site.get(canonical_site(site))  # `-1:clock` is `setup:clock`, as the store writes it
        return None if e is None else e.value

    def seq_of(self, site: str) -> int:
        e = self.by_site.get(canonical_site(site))
        if e is None:
            raise OracleError(f"site {site} does not exist in run {self.run.id}")
        return e.seq

    def outcome(self) -> Outcome | None:
        """The recording's outcome event, read as the store reads a run's outcome column."""
        return Outcome.read(next((e.value for e in reversed(self.events) if e.kind == "outcome"), None))[0]
