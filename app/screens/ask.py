"""A one-line question (go to…, export to…): the answer is checked before the dialog
closes; a wrong one keeps it open with the reason, and nothing happens."""

from __future__ import annotations

from typing import Any, Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from tttr.sessions.safe_text import visible


class AskScreen(ModalScreen[Any]):
    """Ask for one line. `check(text)` returns what the dialog dismisses with, or raises
    ValueError (or a TTTRError) whose message says why the text is refused."""

    BINDINGS = [Binding("escape", "cancel", "cancel")]

    def __init__(self, title: str, hint: str, check: Callable[[str], Any], value: str = "") -> None:
        super().__init__()
        self.title_text, self.hint, self.check, self.value = title, hint, check, value

    def compose(self) -> ComposeResult:
        with Vertical(id="ask-dialog"):
            yield Label(Text(self.title_text), id="ask-title")
            yield Input(value=self.value, id="ask-value", select_on_focus=False)
            yield Label(Text(self.hint), classes="ask-hint")
            yield Label("", id="ask-error")

    def on_mount(self) -> None:
        self.query_one("#ask-value", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            answer = self.check(event.value)
        except ValueError as exc:
            self.refuse(str(exc))
            return
        except Exception as exc:  # a TTTRError: the user's mistake, said in one line
            if getattr(exc, "exit_code", None) is None:
                raise
            self.refuse(str(exc))
            return
        self.dismiss(answer)

    def refuse(self, reason: str) -> None:
        error = self.query_one("#ask-error", Label)
        error.update(Text(visible(reason)))
        error.add_class("-shown")

    @property
    def error(self) -> str:
        return str(self.query_one("#ask-error", Label).render())

    def action_cancel(self) -> None:
        self.dismiss(None)
