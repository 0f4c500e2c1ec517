"""The message strip: a step's generated tokens read as text, the selected one marked.

The strip has a fixed height, so updating it never re-lays out the screen, except on a
short terminal when the cursor enters or leaves a step with no tokens, where it shrinks to
one line (the -empty class; styles in app.tcss); it shows the stretch of the message
around the selected token that fits.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from tttr.app.runview import token_pos, value_problem
from tttr.sessions.safe_text import visible
from tttr.sessions.vocabulary import SETUP, SETUP_STEP

LINES_BEFORE = 2  # lines of text shown before the selected token (about)
LINES = 5
PIECE = 512  # characters of one token's text


class MessageStrip(Static):
    """The screen sets the step's token events and the selected position."""

    def show_tokens(self, step: int, tokens: list, selected: int | None) -> None:
        name = SETUP if step == SETUP_STEP else f"step {visible(str(step), newlines=False)}"
        title = Text(f"{name} message ", style="bold")
        self.set_class(not tokens, "-empty")  # the strip shrinks (a layout) only when this changes
        if not tokens:
            self.update(title + Text("(no generated tokens in this step)", style="dim"), layout=False)
            return
        width = max(20, self.content_size.width)
        # One token's text can be anything a file holds: at most a few lines of it are shown.
        pieces = [visible(e.value.get("text", "")[:PIECE]) if value_problem(e) is None else "✗" for e in tokens]
        at = 0
        if selected is not None:
            at = next((i for i, e in enumerate(tokens) if token_pos(e) == selected), 0)
        lo, used = at, 0
        while lo > 0 and used < LINES_BEFORE * width:
            lo -= 1
            used += width if "\n" in pieces[lo] else len(pieces[lo])
        hi, used = at, 0
        while hi < len(pieces) and used < (LINES - LINES_BEFORE) * width:
            used += width if "\n" in pieces[hi] else len(pieces[hi])
            hi += 1
        text = title + Text(f"({len(tokens)} tokens)\n", style="dim")
        if lo:
            text.append("… ", style="dim")
        for i in range(lo, hi):
            piece = pieces[i]
            if i == at and selected is not None:
                shown = piece if piece.strip() else piece.replace(" ", "␣").replace("\n", "⏎\n") or "∅"
                text.append(shown, style="bold reverse")
            else:
                text.append(piece)
        if hi < len(pieces):
            text.append(" …", style="dim")
        self.update(text, layout=False)
