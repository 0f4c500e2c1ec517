"""Text from a session database is untrusted: it is shown, never interpreted.

`visible` makes every control character visible as a Python-style escape, so that a
recorded string cannot move the cursor, retitle the terminal, clear the screen or hide
text (bidirectional overrides). Newlines and tabs stay, because outputs are multi-line.
Markup is a separate matter: callers pass the result to Rich as `Text`, never as markup.
"""

from __future__ import annotations

import json
import re

# C0 except \t and \n, DEL, C1, and the Unicode formatting characters that reorder or hide
# text (bidi embeddings/overrides/isolates, zero-width joiners are harmless and kept).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _escape(match: re.Match) -> str:
    ch = match.group()
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: object, *, newlines: bool = True) -> str:
    """`text` as a string with its control characters shown as escapes (`\\x1b`, `\\u202e`).

    newlines=False escapes \\n and \\t too, for one-line places (titles, table cells)."""
    s = text if isinstance(text, str) else str(text)
    out = _CONTROL.sub(_escape, s)
    if not newlines:
        out = out.replace("\n", "\\n").replace("\t", "\\t")
    return out


def _cut(line: str, width: int, whole: bool = True) -> str:
    """The one truncation rule: at most `width` characters, an ellipsis where cut."""
    return line if len(line) <= width and whole else line[: width - 1] + "…"


def short(text: object, width: int = 80) -> str:
    """Text in one line of at most `width` characters, whitespace collapsed, controls
    visible (titles, table cells, notifications)."""
    raw = str(text)
    head = raw[: width * 8]  # enough for the line; never split a huge value
    return _cut(visible(" ".join(head.split())), width, len(head) == len(raw))


def brief(value: object, width: int = 70) -> str:
    """A recorded value in one line of at most `width` characters, for messages such as
    "replay diverged at 2:tool: recorded …, live …": a string as its repr, anything else as
    JSON, control characters visible, cut with an ellipsis."""
    if isinstance(value, str):
        text = repr(value[: width * 4])
    else:
        try:
            text = json.dumps(value, default=str)
        except (ValueError, RecursionError):  # a value too deep or circular to write
            text = repr(type(value))
    return _cut(visible(text, newlines=False), width)
