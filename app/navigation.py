"""Where a debugger's navigation keys go, as plain functions of a `RunView` (no textual):
`:` go to an event, a step or a site; `n`/`N` the next or previous search match; `'`
the next bookmark; `y` the value under the cursor as text; `p` on a token, the context it
was conditioned on (the step's prompt, then the tokens generated before it).
"""

from __future__ import annotations

import bisect
import json
import re

from rich.text import Text

from tttr.app.describe import token_with_id
from tttr.app.runview import RunView, token_pos, value_problem
from tttr.sessions.safe_text import short, visible
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


CONTEXT_CHARS = 1500  # of the prompt's end shown before the generated tokens (the text nearest the position)
TOKEN_CHARS = 200  # of one generated token's text


def token_context(prompt_event, prompt, tokens: list, pos: int) -> Text:
    """What the token at position `pos` of a step was conditioned on, as text: the end of the
    step's prompt (`prompt`: its text rebuilt from the record, an `engine.replay.prompts.Prompt`,
    or a line saying why there is none), then the step's tokens before `pos` (`tokens`: its
    token events, in order), then the token itself, marked. Recorded text: controls visible,
    never markup."""
    token = next((e for e in tokens if token_pos(e) == pos), None)
    before = [e for e in tokens if (token_pos(e) or 0) < pos]
    n_prompt = prompt.n_tokens if hasattr(prompt, "n_tokens") else (
        prompt_event.value.get("n_tokens") if isinstance(prompt_event.value, dict) else None)
    step = prompt_event.step
    text = Text(f"context of {step}:token:{pos}", style="bold reverse")
    if token is not None and value_problem(token) is None:
        text.append(" " + _token_label(token), style="bold reverse")
    text.append(f"\n{short(n_prompt if n_prompt is not None else '?', 12)} prompt tokens, then {len(before)} "
                "generated before it; the model read this, the token last:\n", style="dim")
    prompt_text = getattr(prompt, "text", None)
    if isinstance(prompt_text, str) and prompt_text:
        tail = prompt_text[-CONTEXT_CHARS:]
        if len(tail) < len(prompt_text):
            text.append(f"… ({len(prompt_text) - len(tail):,} characters before)\n", style="dim")
        text.append(visible(tail))
    else:
        why = prompt if isinstance(prompt, str) else "the prompt's text is not rebuilt"
        text.append(f"[{visible(why, newlines=False)}]\n", style="dim italic")
    for e in before:
        text.append(_token_text(e), style="cyan")
    if token is not None:
        shown = _token_text(token)
        text.append(shown if shown.strip() else shown.replace(" ", "␣").replace("\n", "⏎\n") or "∅",
                    style="bold reverse")
    return text


def _token_text(event) -> str:
    value = event.value
    if value_problem(event) is not None or not isinstance(value, dict) or not isinstance(value.get("text"), str):
        return "✗"
    return visible(value["text"][:TOKEN_CHARS])


def _token_label(event) -> str:
    value = event.value if isinstance(event.value, dict) else {}
    return token_with_id(value.get("text"), value.get("id"))
