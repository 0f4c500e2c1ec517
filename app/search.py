"""Fuzzy search over a run's commands, outputs and message text (rapidfuzz).

The corpus is step-level (messages, commands, output lines), read with kind filters, so
it stays small however many token and logits events the run holds. No textual here.
"""

from __future__ import annotations

from dataclasses import dataclass

from rapidfuzz import fuzz, process

from app.runview import RunView

MAX_OUTPUT_LINES = 400  # per command; the rest of a long output is not indexed


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int  # the event a hit jumps to
    step: int
    what: str  # "command" | "output" | "stderr" | "message"
    text: str


@dataclass(frozen=True, slots=True)
class Hit:
    entry: Entry
    score: float


def build_corpus(view: RunView) -> list[Entry]:
    store, run = view.store, view.run_id
    entries: list[Entry] = []
    for event in store.events(run, kind="message"):
        text = view.text(event.value.get("text") if isinstance(event.value, dict) else None)
        for line in text.splitlines():
            if line.strip():
                entries.append(Entry(event.seq, event.step, "message", line.strip()))
    for event in store.events(run, kind="tool"):
        value = event.value if isinstance(event.value, dict) else {}
        entries.append(Entry(event.seq, event.step, "command", view.text(value.get("cmd"))))
        for what in ("stdout", "stderr"):
            lines = [ln for ln in view.text(value.get(what)).splitlines() if ln.strip()]
            for line in lines[:MAX_OUTPUT_LINES]:
                entries.append(Entry(event.seq, event.step, "output" if what == "stdout" else what, line.strip()))
    entries.sort(key=lambda e: (e.seq, e.what != "command"))
    return entries


def search(corpus: list[Entry], query: str, limit: int = 50, cutoff: float = 60.0) -> list[Hit]:
    """Best matches first; ties keep timeline order. Substrings score highest
    (partial_ratio), so `rotate` finds `logrotate -f /etc/…` as well as typos of it."""
    query = query.strip()
    if not query:
        return []
    found = process.extract(
        query.lower(), [e.text.lower() for e in corpus], scorer=fuzz.partial_ratio,
        limit=limit, score_cutoff=cutoff,
    )
    hits = [Hit(corpus[index], score) for _, score, index in found]
    hits.sort(key=lambda h: (-h.score, h.entry.seq))
    return hits
