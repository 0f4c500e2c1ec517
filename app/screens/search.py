"""The search dialog: fuzzy search over commands, outputs and messages; dismisses with the
sequence number of the chosen hit."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from tttr.app import describe, search
from tttr.app.describe import short


class SearchScreen(ModalScreen[int | None]):
    BINDINGS = [
        Binding("escape", "cancel", "close"),
        Binding("down", "focus_hits", "hits", show=False),
    ]

    def __init__(self, corpus: list[search.Entry] | None, query: str = "") -> None:
        """`corpus` None: it is being built; the screen below calls `set_corpus`."""
        super().__init__()
        self.corpus = corpus
        self.query_text = query
        self.hits: list[search.Hit] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="search-dialog"):
            yield Label("Search the run: commands, outputs, messages, prompts, outcomes, clocks", id="search-title")
            yield Input(value=self.query_text, placeholder="fuzzy search…", id="search-input")
            yield OptionList(id="search-hits")
            yield Label("", id="search-count")

    def on_mount(self) -> None:
        self.query_one("#search-input", Input).focus()
        self._refresh_hits(self.query_text)

    @on(Input.Changed, "#search-input")
    def _changed(self, event: Input.Changed) -> None:
        self.query_text = event.value
        self._refresh_hits(event.value)

    def set_corpus(self, corpus: list[search.Entry]) -> None:
        self.corpus = corpus
        if self.is_mounted:
            self._refresh_hits(self.query_one("#search-input", Input).value)

    def index_failed(self, error: str) -> None:
        if self.is_mounted:
            self.query_one("#search-count", Label).update(
                Text(f"cannot index this run: {short(error, 200)}", style="bold red"))

    def _refresh_hits(self, query: str) -> None:
        count = self.query_one("#search-count", Label)
        if self.corpus is None:
            count.update(Text("indexing the run's events …", style="italic"))
            return
        self.hits = search.search(self.corpus, query)
        hits = self.query_one("#search-hits", OptionList)
        hits.clear_options()
        for i, hit in enumerate(self.hits):
            label = Text(f"step {describe.step_label(hit.entry.step):>5} ", style="bold")
            style = {"command": "yellow", "message": "green", "outcome": "bold", "prompt": "cyan",
                     "unreadable": "bold red"}.get(hit.entry.what, "dim")
            label.append(f"{hit.entry.what:<8}", style=style)
            label.append(" " + short(hit.entry.text, 90), style="bold red" if hit.entry.what == "unreadable" else "")
            label.append(f"  {hit.score:.0f}", style="dim")
            hits.add_option(Option(label, id=f"hit-{i}"))
        if self.hits:
            hits.highlighted = 0
        shown = f"{len(self.hits)} hits" if query.strip() else f"{len(self.corpus)} lines indexed"
        count.update(Text(shown))

    @on(Input.Submitted, "#search-input")
    def _submitted(self) -> None:
        hits = self.query_one("#search-hits", OptionList)
        if self.hits:
            self.dismiss(self.hits[hits.highlighted or 0].entry.seq)

    @on(OptionList.OptionSelected, "#search-hits")
    def _selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.hits[event.option_index].entry.seq)

    def action_focus_hits(self) -> None:
        self.query_one("#search-hits", OptionList).focus()

    def action_cancel(self) -> None:
        self.dismiss(None)
