"""The edit dialog: a new value for one clock, tool result (a command's, or an SDK
function's), token, or setup value (a start-tree file, a variable), checked before it is accepted. It dismisses with the value text; an
invalid value keeps it open with the reason, and nothing is written until the screen below
starts the fork."""

from __future__ import annotations

import json
from typing import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList
from textual.widgets.option_list import Option

from tttr.sessions.safe_text import visible

HELP = {
    "clock": "an ISO date-time (2026-03-01T09:00:00) or a shift of the recorded value: +90, -3600, +2h, -1d",
    "tool": 'new stdout as plain text, exit=N for the exit code, or JSON: {"stdout": …, "stderr": …, "exit_code": N}',
    "function": 'the new result as JSON (3, "text", [1, 2]) or plain text; {"error": "message"} makes the tool raise',
    "token": 'pick a recorded alternative, or type a token id (1234) or one token of text (quote as JSON to force text: "5")',
    "file": 'the file\'s new text, as JSON for newlines and escapes ("line one\\nline two\\n") or plain text',
    "env": 'the variable\'s value, exported before the first step: plain text, or JSON for escapes',
}


class EditScreen(ModalScreen[str | None]):
    """Edit the value at `site`. `validate(text)` returns None when the value is
    acceptable, else the reason it is not."""

    BINDINGS = [
        Binding("escape", "cancel", "cancel"),
        Binding("ctrl+s", "confirm", "fork"),
    ]

    def __init__(
        self,
        site: str,
        kind: str,
        current: str,
        validate: Callable[[str], str | None],
        alternatives: list[tuple[int, str | None, float]] | None = None,
    ) -> None:
        super().__init__()
        self.site, self.kind, self.current = site, kind, current
        self.validate = validate
        self.alternatives = alternatives or []

    def compose(self) -> ComposeResult:
        with Vertical(id="edit-dialog"):
            yield Label(Text(f"Edit {visible(self.site, newlines=False)} and fork"), id="edit-title")
            yield Label(Text(f"recorded: {visible(self.current, newlines=False)}"), id="edit-current")
            if self.alternatives:
                yield Label("recorded alternatives (enter picks one):", classes="edit-hint")
                yield OptionList(
                    *[Option(self._alternative_label(a), id=f"alt-{a[0]}") for a in self.alternatives],
                    id="edit-alternatives",
                )
            yield Label(Text(HELP.get(self.kind, "")), classes="edit-hint")
            yield Input(value=self.current, id="edit-value", select_on_focus=True)
            yield Label("", id="edit-error")
            with Horizontal(id="edit-buttons"):
                yield Button("Fork", variant="primary", id="edit-fork")
                yield Button("Cancel", id="edit-cancel")

    def on_mount(self) -> None:
        target = "#edit-alternatives" if self.alternatives else "#edit-value"
        self.query_one(target).focus()

    @staticmethod
    def _alternative_label(alt: tuple[int, str | None, float]) -> Text:
        token_id, text, logprob = alt
        shown = visible(json.dumps(str(text), ensure_ascii=False), newlines=False) if text is not None else "?"
        return Text(f"{token_id:>6}  {shown:<16}  lp {logprob:.3f}")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        token_id = int(str(event.option.id).removeprefix("alt-"))
        self.query_one("#edit-value", Input).value = f"id:{token_id}"
        self.action_confirm()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_confirm()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "edit-fork":
            self.action_confirm()
        else:
            self.action_cancel()

    def action_confirm(self) -> None:
        value = self.query_one("#edit-value", Input).value
        reason = self.validate(value)
        error = self.query_one("#edit-error", Label)
        if reason is not None:
            error.update(Text(visible(reason)))
            error.add_class("-shown")
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)
