"""The fork bar: what a running fork has done, and how to stop it."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Label, ProgressBar

from tttr.sessions.safe_text import visible


class ForkProgress(Horizontal):
    """Hidden until the screen starts a fork; the screen sets its progress."""

    started = 0  # forks this bar has shown (a short fork can be over before anyone looks)

    def compose(self) -> ComposeResult:
        yield Label("", id="fork-label")
        yield ProgressBar(total=None, show_eta=False, id="fork-bar")
        yield Label("x cancel", id="fork-hint")

    def start(self, site: str, value: str) -> None:
        self.query_one("#fork-label", Label).update(Text(visible(f"forking at {site} = {value!r} …", newlines=False)))
        self.query_one("#fork-bar", ProgressBar).update(total=None, progress=0)
        self.display = True
        self.started += 1

    def advance(self, done: int, total: int | None, text: str) -> None:
        self.query_one("#fork-bar", ProgressBar).update(total=total or None, progress=done)
        if text:
            self.query_one("#fork-label", Label).update(Text(visible(str(text), newlines=False)))

    def stopping(self) -> None:
        self.query_one("#fork-label", Label).update("cancelling: the fork stops after this step …")

    def stop(self) -> None:
        self.display = False

    @property
    def running(self) -> bool:
        """A fork is under way: the bar shows from `start` to `stop` (quitting asks first)."""
        return bool(self.display)
