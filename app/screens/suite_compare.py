"""Two suites compared, as `tttr compare` prints it (issue 30): reached from the stats screen
(`c`: the suite shown against the one before it in the same database). The comparison is read
in a worker thread on a read-only connection of its own; the text and the terminal plot are
`tttr compare`'s, so the screen and the command cannot disagree."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, LoadingIndicator, Static

from tttr.app.screens.footer import FittedFooter
from tttr.app.screens.help import label_back
from tttr.sessions.safe_text import visible


class ComparisonRead(Message):
    """The comparison's text and plot, or why not (a line)."""

    def __init__(self, text: str | None, plot: str | None, error: str | None = None) -> None:
        super().__init__()
        self.text, self.plot, self.error = text, plot, error


class SuiteCompareScreen(FittedFooter, Screen):
    CSS_PATH = "../styles/experiments.tcss"
    BINDINGS = [Binding("escape", "back", "back")]
    place = "compare suites"

    def __init__(self, suite_a: str, suite_b: str) -> None:
        super().__init__()
        self.suite_a, self.suite_b = suite_a, suite_b
        self.text: str | None = None  # the comparison shown

    def compose(self) -> ComposeResult:
        yield Static("", id="stats-title")
        yield LoadingIndicator(id="stats-loading")
        with VerticalScroll(id="stats-body"):
            yield Static("", id="compare-text")
            yield Static("", id="stats-plot")
        yield Footer()

    def on_mount(self) -> None:
        label_back(self)
        title = Text("A ", style="bold")
        title.append(visible(self.suite_a, newlines=False), style="bold")
        title.append("  vs  B ", style="dim")
        title.append(visible(self.suite_b, newlines=False), style="bold")
        self.query_one("#stats-title", Static).update(title)
        from tttr.app.stats_plot import PLOT_WIDTH

        width = max(30, min(PLOT_WIDTH, self.app.size.width - 5))
        self.run_worker(lambda: self._load(width), thread=True, exclusive=True, exit_on_error=False, name="compare")

    def _load(self, width: int) -> None:
        from tttr.app.commands.compare import comparison_text, resolve
        from tttr.app.stats_plot import compare_terminal_plot
        from tttr.engine.replay.comparison import compare

        db = str(self.app.db_path)
        try:
            c = compare(resolve(self.suite_a, db), resolve(self.suite_b, db))
        except Exception as exc:  # noqa: BLE001 - shown on screen as its line
            known = getattr(exc, "exit_code", None) is not None
            self.post_message(ComparisonRead(None, None, str(exc) if known else f"{type(exc).__name__}: {exc}"))
            return
        try:
            plot = compare_terminal_plot(c, width)
        except Exception as exc:  # noqa: BLE001 - the text stands without its plot
            plot = f"no plot: {type(exc).__name__}: {exc}"
        self.post_message(ComparisonRead(comparison_text(c), plot))

    def on_comparison_read(self, message: ComparisonRead) -> None:
        self.query_one("#stats-loading").display = False
        if message.text is None:
            self.query_one("#compare-text", Static).update(Text(visible(message.error, newlines=False),
                                                                style="bold red"))
            return
        self.text = message.text
        self.query_one("#compare-text", Static).update(Text(message.text))  # visible() already applied
        self.query_one("#stats-plot", Static).update(Text.from_ansi(message.plot))

    def action_back(self) -> None:
        self.app.pop_screen()
