"""Fuzzy search over a run's commands, outputs and message text (rapidfuzz).

The corpus is step-level (messages, commands, output lines), read with kind filters, so
it stays small however many token and logits events the run holds. No textual here.
"""

from __future__ import annotations

from dataclasses import dataclass

from rapidfuzz import fuzz, process

from tttr.app.runview import RunView, value_problem

MAX_OUTPUT_LINES = 400  # per command; the rest of a long output is not indexed


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int  # the event a hit jumps to
    step: int
    what: str  # "command" | "output" | "stderr" | "message" | "unreadable"
    text: str


@dataclass(frozen=True, slots=True)
class Hit:
    entry: Entry
    score: float


def _events(view: RunView, kind: str) -> list:
    """The run's events of `kind`; when the store refuses the indexed read (an event it
    cannot decode), the events read one window at a time, stand-ins included."""
    try:
        return view.store.events(view.run_id, kind=kind)
    except Exception:  # noqa: BLE001 - the slow path finds the unreadable one
        return [e for e in (view.event(i) for i in range(view.count)) if e is not None and e.kind in (kind, "?")]


def build_corpus(view: RunView) -> list[Entry]:
    """Lines to search. Text is kept as recorded (controls made visible, never markup,
    where it is shown); an event whose value is unreadable is indexed as such."""
    entries: list[Entry] = []
    seen: set[int] = set()

    def unreadable(event) -> bool:
        problem = value_problem(event)
        if problem is not None and event.seq not in seen:
            seen.add(event.seq)
            entries.append(Entry(event.seq, event.step, "unreadable", f"unreadable {event.site}: {problem}"))
        return problem is not None

    for event in _events(view, "message"):
        if unreadable(event):
            continue
        text = view.text(event.value.get("text"))
        for line in text.splitlines():
            if line.strip():
                entries.append(Entry(event.seq, event.step, "message", line.strip()))
    for event in _events(view, "tool"):
        if unreadable(event):
            continue
        value = event.value
        entries.append(Entry(event.seq, event.step, "command", view.text(value.get("cmd"))))
        for what in ("stdout", "stderr"):
            lines = [ln for ln in view.text(value.get(what)).splitlines() if ln.strip()]
            for line in lines[:MAX_OUTPUT_LINES]:
                entries.append(Entry(event.seq, event.step, "output" if what == "stdout" else what, line.strip()))
    for event in _events(view, "action"):
        unreadable(event)
    entries.sort(key=lambda e: (e.seq, e.what != "command"))
    return entries


def search(corpus: list[Entry], query: str, limit: int | None = 50, cutoff: float = 60.0) -> list[Hit]:
    """Best matches first; ties keep timeline order. Substrings score highest
    (partial_ratio), so `rotate` finds `logrotate -f /etc/…` as well as typos of it.
    limit None: every match (what `n`/`N` step through)."""
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
