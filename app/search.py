"""Fuzzy search over every event of a run that says something in words (rapidfuzz).

Every kind is indexed but the per-position ones (a token's text is in its step's message;
logits hold numbers): prompts (their rebuilt text when the app has it, else what the record
holds), messages, actions, clock reads, the setup, commands with their output lines, SDK
calls, outcomes with their checker's message, and kinds this app does not know, by their
one-line summary. Rows are read raw and only these are decoded, so the corpus stays small
and quick however many token and logits events the run holds. No textual here.
"""

from __future__ import annotations

from dataclasses import dataclass

from rapidfuzz import fuzz, process

from tttr.app.runview import RunView, value_problem

MAX_OUTPUT_LINES = 400  # per command; the rest of a long output is not indexed
NOT_INDEXED = ("token", "logits")  # per position: their words are the message's


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int  # the event a hit jumps to
    step: int
    what: str  # "command" | "output" | "stderr" | "message" | "prompt" | "outcome" | a kind | "unreadable"
    text: str


@dataclass(frozen=True, slots=True)
class Hit:
    entry: Entry
    score: float


def _events(view: RunView) -> list:
    """The run's events but tokens and logits, decoded; when the store refuses to read
    them raw, read one window at a time, stand-ins for unreadable events included."""
    try:
        return [view.store.decode_raw(view.run_id, raw) for batch in view.store.raw_events(view.run_id)
                for raw in batch if raw.kind not in NOT_INDEXED]
    except Exception:  # noqa: BLE001 - the slow path finds the unreadable one
        return [e for e in (view.event(i) for i in range(view.count)) if e is not None and e.kind not in NOT_INDEXED]


def build_corpus(view: RunView, prompts: dict | None = None) -> list[Entry]:
    """Lines to search. Text is kept as recorded (controls made visible, never markup,
    where it is shown); an event whose value is unreadable is indexed as such. `prompts`
    ({step: Prompt}, rebuilt from the record) puts the prompts' text in the corpus."""
    from tttr.app import describe

    entries: list[Entry] = []

    def lines(event, what: str, text: str, limit: int | None = None) -> None:
        found = [ln.strip() for ln in text.splitlines() if ln.strip()]
        for line in found[:limit]:
            entries.append(Entry(event.seq, event.step, what, line))

    for event in _events(view):
        problem = value_problem(event)
        if problem is not None:
            entries.append(Entry(event.seq, event.step, "unreadable", f"unreadable {event.site}: {problem}"))
            continue
        value, kind = event.value, event.kind
        if kind == "message":
            lines(event, "message", view.text(value.get("text")))
        elif kind == "tool" and "function" not in value:
            entries.append(Entry(event.seq, event.step, "command", view.text(value.get("cmd"))))
            lines(event, "output", view.text(value.get("stdout")), MAX_OUTPUT_LINES)
            lines(event, "stderr", view.text(value.get("stderr")), MAX_OUTPUT_LINES)
        elif kind == "prompt":
            prompt = (prompts or {}).get(event.step)
            text = getattr(prompt, "text", None)
            lines(event, "prompt", text if isinstance(text, str) else describe.summary(event).plain)
        elif kind == "outcome":
            lines(event, "outcome", describe.summary(event).plain)
            for key in ("checker_output", "stderr", "error"):
                if isinstance(value, dict) and value.get(key) is not None:
                    lines(event, "outcome", view.text(value.get(key)), MAX_OUTPUT_LINES)
        elif kind == "action" and isinstance(value.get("cmd"), str):
            continue  # its command is the tool result's, indexed there (a hit lands on the result)
        else:  # `done` actions, clock reads, the setup, SDK calls, and kinds this app does not know
            lines(event, kind if len(kind) <= 12 else "event", describe.summary(event).plain)
    entries.sort(key=lambda e: (e.seq, e.what != "command"))
    return entries


def _score(query: str, text: str, *, processor=None, score_cutoff=None) -> float:
    """partial_ratio, but a line shorter than the query (a checker's `ok`) is scored whole:
    it cannot hold the query, and a partial match of it would rank `ok` for `gzip -k`."""
    if len(text) < len(query):
        return fuzz.ratio(query, text, score_cutoff=score_cutoff)
    return fuzz.partial_ratio(query, text, score_cutoff=score_cutoff)


def search(corpus: list[Entry], query: str, limit: int | None = 50, cutoff: float = 60.0) -> list[Hit]:
    """Best matches first; ties keep timeline order. Substrings score highest
    (partial_ratio), so `rotate` finds `logrotate -f /etc/…` as well as typos of it.
    limit None: every match (what `n`/`N` step through)."""
    query = query.strip()
    if not query:
        return []
    found = process.extract(
        query.lower(), [e.text.lower() for e in corpus], scorer=_score,
        limit=limit, score_cutoff=cutoff,
    )
    hits = [Hit(corpus[index], score) for _, score, index in found]
    hits.sort(key=lambda h: (-h.score, h.entry.seq))
    return hits
