"""Where two recorded values differ: what counts as an event's value when two runs (or a
recording and its replay) are compared, and the first site of a layer where they differ.

A low module (nothing above sessions/): the oracle, the results, the run kinds' replays and
`tttr diff` (engine/replay/diff.py, which asks each run's kind for its steps) all use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tttr.sessions.safe_text import brief, short, visible

# What counts as "the value" of an event when comparing two runs, per kind.
COMPARED = {
    "clock": ("t",),
    "tool": ("stdout", "stderr", "exit_code", "result", "error"),  # a command's outcome, or an SDK function's
    "token": ("id",),
    "logits": ("digest",),
    "action": ("cmd", "done"),
    "setup": ("tree", "exports"),  # the start tree and the variables a run starts with
}


def compared_value(kind: str, value: Any) -> Any:
    keys = COMPARED.get(kind)
    if keys is None or not isinstance(value, dict):
        return value
    picked = {k: value.get(k) for k in keys if k in value}
    return picked[keys[0]] if len(keys) == 1 else picked


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first site of one layer where two runs' values differ (or that only one has).
    `a` is the first run's value — in a replay or fork, the recording's — and `b` the
    second's, the live one; `names` says which is which in messages and in JSON."""

    site: str
    layer: str
    a: Any
    b: Any
    names: tuple[str, str] = ("a", "b")
    absent: str = ""  # "a" or "b": the run that has no event at this site (its value is None)
    texts: tuple[str | None, str | None] = (None, None)  # a token divergence: each side's token text, where known

    def shown(self, side: str, width: int = 60) -> str:
        """One side's value as a person reads it: a site that run does not have says so; a
        token reads as its text with its id beside it."""
        if self.absent == side:
            return "(no such event)"
        value, text = (self.a, self.texts[0]) if side == "a" else (self.b, self.texts[1])
        if self.layer == "token" and isinstance(text, str):
            return token_label(text, value, width)
        return brief(value, width)

    def describe(self) -> str:
        first, second = self.names
        return f"{self.site} ({self.layer} layer): {first} {self.shown('a')}, {second} {self.shown('b')}"

    def to_json(self) -> dict:
        first, second = self.names
        return {"site": self.site, "layer": self.layer, first: self.a, second: self.b}


def token_label(text: Any, token_id: Any, width: int = 60) -> str:
    """A token as a person reads it, its id beside it: `" goodbye" (93)` (its text untrusted:
    quoted, controls escaped, cut past `width`); the id alone when its text is not known."""
    if not isinstance(text, str):
        return short(token_id, 20)
    cut = text if len(text) <= width else text[:width - 1] + "…"
    return f"{visible(json.dumps(cut, ensure_ascii=False), newlines=False)} ({short(token_id, 20)})"


def first_request_difference(a: dict, b: dict) -> tuple[str, Any, Any] | None:
    """(what, a's value, b's value) of the first message, then parameter, where two model
    requests (OpenAI chat or completions bodies) differ; None when they are the same."""
    a_msgs, b_msgs = a.get("messages"), b.get("messages")
    if isinstance(a_msgs, list) and isinstance(b_msgs, list):
        for i in range(max(len(a_msgs), len(b_msgs))):
            x = a_msgs[i] if i < len(a_msgs) else None
            y = b_msgs[i] if i < len(b_msgs) else None
            if x != y:
                return f"message {i}", x, y
    elif a_msgs != b_msgs:
        return "messages", a_msgs, b_msgs
    for key in sorted((set(a) | set(b)) - {"messages"}):
        if a.get(key) != b.get(key):
            return f"parameter {key}", a.get(key), b.get(key)
    return None
