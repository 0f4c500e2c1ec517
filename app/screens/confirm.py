"""A yes/no question before something that cannot be undone (deleting a run, quitting
while a fork runs). It dismisses with True only for an explicit yes."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class ConfirmScreen(ModalScreen[bool]):
    """Ask `question`; `y` or the yes button confirms, `n`, escape or the other button do not."""

    BINDINGS = [
        Binding("y", "answer(True)", "yes"),
        Binding("n,escape", "answer(False)", "no"),
    ]

    def __init__(self, question: Text | str, yes: str = "Yes", no: str = "Cancel") -> None:
        super().__init__()
        self.question = question if isinstance(question, Text) else Text(question)
        self.yes, self.no = yes, no

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-dialog"):
            yield Label(self.question, id="confirm-question")
            with Horizontal(id="confirm-buttons"):
                yield Button(f"{self.yes} (y)", variant="error", id="confirm-yes")
                yield Button(f"{self.no} (n)", id="confirm-no")

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()  # enter alone never confirms

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)
