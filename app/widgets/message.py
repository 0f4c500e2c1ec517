"""The message strip: a step's generated tokens read as text, the selected one marked."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from app.runview import token_pos

CONTEXT = 160  # tokens shown either side of the selected one


class MessageStrip(Static):
    """The screen sets the step's token events and the selected position."""

    def show_tokens(self, step: int, tokens: list, selected: int | None) -> None:
        title = Text(f"step {step} message ", style="bold")
        if not tokens:
            self.update(title + Text("(no generated tokens in this step)", style="dim"))
            return
        at = 0
        if selected is not None:
            at = next((i for i, e in enumerate(tokens) if token_pos(e) == selected), 0)
        lo, hi = max(0, at - CONTEXT), min(len(tokens), at + CONTEXT)
        text = title + Text(f"({len(tokens)} tokens)\n", style="dim")
        if lo:
            text.append("… ", style="dim")
        for i in range(lo, hi):
            value = tokens[i].value if isinstance(tokens[i].value, dict) else {}
            piece = str(value.get("text", ""))
            if i == at and selected is not None:
                text.append(piece if piece.strip() else piece.replace(" ", "␣").replace("\n", "⏎\n") or "∅",
                            style="bold reverse")
            else:
                text.append(piece)
        if hi < len(tokens):
            text.append(" …", style="dim")
        self.update(text)
