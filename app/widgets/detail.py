"""The detail pane: everything recorded about the event under the cursor."""

from __future__ import annotations

from rich.console import RenderableType
from textual.containers import VerticalScroll
from textual.widgets import Static


class DetailPane(VerticalScroll):
    """Shows one renderable; the screen sets it when the cursor moves."""

    def compose(self):
        yield Static(id="detail-body")

    def show(self, renderable: RenderableType) -> None:
        self.query_one("#detail-body", Static).update(renderable)
        self.scroll_home(animate=False)
