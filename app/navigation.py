"""Where a debugger's navigation keys go, as plain functions of a `RunView` (no textual):
`:` go to an event, a step or a site; `n`/`N` the next or previous search match; `'`
the next bookmark; `y` the value under the cursor as text.
"""

from __future__ import annotations

import bisect
import json
import re

from tttr.app.runview import RunView, value_problem
from tttr.sessions.vocabulary import SETUP, SETUP_STEP, canonical_site, site_parts

GOTO_HELP = ("57: event 57 · s2: step 2 (s0 the first, setup the setup) · 2:tool or 2:token:5: "
             "a site · +10 / -10: that many events on · $: the last event")
_STEP = re.compile(r"s(?:tep)?\s*(-?\d+)$")


def goto_target(view: RunView, text: str, cursor: int = 0) -> int:
    """The event `text` names (see GOTO_HELP); ValueError with the reason when it names none."""
    text = text.strip().lower()
    last = view.count - 1
    if not text:
        raise ValueError(f"type an event number (0–{last}), a step (s0) or a site (2:tool)")
    if text in ("$", "end"):
        return last
    if text[0] in "+-" and text[1:].isdigit():
        target = cursor + int(text)
        if not 0 <= target <= last:
            raise ValueError(f"{text} from event {cursor} is outside the run (events 0–{last})")
        return target
    if text.isdigit():
        if int(text) > last:
            raise ValueError(f"no event {text}: this run has events 0–{last}")
        return int(text)
    found = _STEP.match(text)
    if found or text == SETUP:
        step = SETUP_STEP if not found else int(found.group(1))
        start = view.step_start(step)
        if start is None:
            raise ValueError(f"no step {SETUP if step == SETUP_STEP else step} in this run")
        return start
    if ":" in text:
        event = view.at(canonical_site(text)) if site_parts(text) is not None else None  # -1:clock is setup:clock
        if event is not None and isinstance(event.seq, int) and event.seq >= 0:
            return event.seq
        raise ValueError(f"no event at site {text!r} in this run")
    raise ValueError(f"{text!r} is not a place: {GOTO_HELP}")


def names_step(text: str) -> bool:
    """Whether a go-to answer names a step (`s3`, `setup`) rather than an event or a site."""
    text = text.strip().lower()
    return text == SETUP or _STEP.match(text) is not None


def next_in(seqs: list[int], cursor: int, forward: bool = True) -> tuple[int | None, bool]:
    """The first of the sorted `seqs` after (or before) `cursor`, wrapping around like
    vim's `n`: (seq, wrapped), or (None, False) when `seqs` is empty."""
    if not seqs:
        return None, False
    if forward:
        i = bisect.bisect_right(seqs, cursor)
        return (seqs[i], False) if i < len(seqs) else (seqs[0], True)
    i = bisect.bisect_left(seqs, cursor)
    return (seqs[i - 1], False) if i > 0 else (seqs[-1], True)


def value_text(view: RunView, event, prompt=None) -> str | None:
    """The value of `event` as a person copies it: a token's or a message's text, a
    clock's time, a command's output, a prompt's text when `prompt` (its rebuilt Prompt)
    is given, else the value as JSON. None while a blob it needs is still loading."""
    problem = value_problem(event)
    if problem is not None:
        return f"unreadable {event.site}: {problem}"
    value = event.value
    if event.kind == "prompt" and isinstance(getattr(prompt, "text", None), str):
        return prompt.text
    if isinstance(value, dict):
        if event.kind in ("token", "message") and "text" in value:
            return view.loaded_text(value["text"])
        if event.kind == "clock" and "t" in value:
            return str(value["t"])
        if event.kind == "tool" and "stdout" in value:
            return view.loaded_text(value["stdout"])
    return json.dumps(value, ensure_ascii=False, indent=2, default=str)
