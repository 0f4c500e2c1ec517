"""The stats screen: a suite recorded by `tttr suite`, read as `tttr stats` reads it — per
task and condition the pass rate with its 95% interval and the action agreement, what
pinning each layer removes of the free condition's disagreement, and the terminal plots."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, LoadingIndicator, Static

from tttr.app.commands.suite import RULE_LINES
from tttr.app.screens.footer import FittedFooter
from tttr.app.screens.help import label_back
from tttr.sessions.safe_text import visible

COLUMNS = ("task", "condition", "runs", "passed", "pass rate [95% CI]", "agreement (pairs)", "removed", "")


class StatsRead(Message):
    """A suite's statistics (a SuiteStats) and its terminal plot, or why not (a line)."""

    def __init__(self, suite_id: str, stats, plot: str | None, error: str | None = None) -> None:
        super().__init__()
        self.suite_id, self.stats, self.plot, self.error = suite_id, stats, plot, error


def _f(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def rows(stats) -> list[tuple[str, ...]]:
    """One row per task (and overall) and condition; the decomposition beside the pinned ones:
    what pinning the layer removes, and the residual under full pinning (must be 0)."""
    from tttr.engine.replay.variance import CONDITIONS, PINNED_LAYER

    out = []
    for t in [*stats.tasks, stats.overall]:
        d = t.decomposition
        for cond in CONDITIONS:
            o = t.by_condition.get(cond)
            if o is None:
                continue
            iv = o.interval
            rate = f"{_f(o.pass_rate)} [{_f(iv.low)},{_f(iv.high)}]" if iv else "-"
            a = o.agreement
            agree = f"{_f(a.fraction)} ({a.agreeing}/{a.pairs})"
            removed, note = "", ""
            if cond in PINNED_LAYER:
                removed = _f(d.removed_by(PINNED_LAYER[cond]), True)
            elif cond == "pinned":
                removed = f"residual {_f(d.residual)}"
                note = "" if d.residual_ok else "NOT ZERO: these replays are not controlled experiments here"
            out.append((visible(t.task, newlines=False), cond, str(o.runs), str(o.passed), rate, agree, removed, note))
    return out


class StatsScreen(FittedFooter, Screen):
    CSS_PATH = "../styles/experiments.tcss"
    BINDINGS = [
        Binding("n", "suite(1)", "next suite"),
        Binding("p", "suite(-1)", "previous suite"),
        Binding("c", "compare", "compare with previous"),
        Binding("escape", "back", "back"),
    ]
    place = "stats"

    def __init__(self, suite_ids: list[str]) -> None:
        super().__init__()
        self.suite_ids = list(suite_ids)
        self.index = len(self.suite_ids) - 1  # the latest, as `tttr stats` reads by default
        self.stats = None  # the SuiteStats shown
        self.plot: Text | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="stats-title")
        yield LoadingIndicator(id="stats-loading")
        with VerticalScroll(id="stats-body"):
            yield DataTable(id="stats-table", cursor_type="row", zebra_stripes=True)
            yield Static(Text("\n".join(RULE_LINES), style="dim"), id="stats-rules")
            yield Static("", id="stats-plot")
        yield Footer()

    def on_mount(self) -> None:
        label_back(self)
        table = self.query_one(DataTable)
        for column in COLUMNS:
            table.add_column(column, key=column or "note")
        self._read()

    def _read(self) -> None:
        suite_id = self.suite_ids[self.index]
        title = Text("suite ", style="bold")
        title.append(visible(suite_id, newlines=False), style="bold")
        title.append(f"  · {self.index + 1} of {len(self.suite_ids)} in {visible(self.app.db_path.name)}", style="dim")
        self.query_one("#stats-title", Static).update(title)
        self.query_one("#stats-loading").display = True
        from tttr.app.stats_plot import PLOT_WIDTH

        # What the terminal leaves (padding, a scrollbar; a bar line takes one column more), at most PLOT_WIDTH.
        width = max(30, min(PLOT_WIDTH, self.app.size.width - 5))
        self.run_worker(lambda: self._load(suite_id, width), thread=True, exclusive=True, exit_on_error=False,
                        name="stats")

    def _load(self, suite_id: str, width: int) -> None:
        """In a worker thread, on a read-only connection of its own: the statistics and the plot."""
        from tttr.app.stats_plot import terminal_plot
        from tttr.engine.replay.suite import suite_stats
        from tttr.sessions.store import Store

        try:
            with Store.open(self.app.db_path, create=False, readonly=True) as store:
                stats = suite_stats(store, suite_id)
        except Exception as exc:  # noqa: BLE001 - shown on screen as its line
            known = getattr(exc, "exit_code", None) is not None
            self.post_message(StatsRead(suite_id, None, None, str(exc) if known else f"{type(exc).__name__}: {exc}"))
            return
        try:
            plot = terminal_plot(stats, width)
        except Exception as exc:  # noqa: BLE001 - the table stands without its plot
            plot = f"no plot: {type(exc).__name__}: {exc}"
        self.post_message(StatsRead(suite_id, stats, plot))

    def on_stats_read(self, message: StatsRead) -> None:
        if message.suite_id != self.suite_ids[self.index]:
            return  # another suite was asked for meanwhile
        self.query_one("#stats-loading").display = False
        table = self.query_one(DataTable)
        table.clear()
        if message.stats is None:
            self.query_one("#stats-plot", Static).update(Text(visible(message.error, newlines=False), style="bold red"))
            return
        self.stats = message.stats
        for row in rows(message.stats):
            table.add_row(*(Text(c, style="bold red" if c.startswith("NOT ZERO") else "") for c in row))
        # plotext draws with ANSI colours; the labels in it went through `visible` first.
        self.plot = Text.from_ansi(message.plot)
        if message.stats.left_out:
            self.plot.append(f"\n{message.stats.left_out} incomplete run(s) left out", style="dim")
        self.query_one("#stats-plot", Static).update(self.plot)
        table.focus()

    def action_suite(self, step: int) -> None:
        index = self.index + step
        if 0 <= index < len(self.suite_ids):
            self.index = index
            self._read()
            return
        self.app.bell()  # nowhere to go: said, not silence
        which = "the latest" if step > 0 else "the oldest"
        self.notify(f"this is {which} of the {len(self.suite_ids)} suite(s) in this database", severity="warning",
                    timeout=3, markup=False)

    def action_compare(self) -> None:
        """This suite (A) against the one before it (B): `tttr compare`'s screen (issue 30)."""
        if self.index == 0:
            self.app.bell()
            self.notify("no earlier suite in this database to compare with", severity="warning", timeout=3, markup=False)
            return
        from tttr.app.screens.suite_compare import SuiteCompareScreen

        self.app.push_screen(SuiteCompareScreen(self.suite_ids[self.index], self.suite_ids[self.index - 1]))

    def action_back(self) -> None:
        self.app.pop_screen()
