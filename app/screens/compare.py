"""Two runs side by side: a fork next to its parent, or any two runs of the database.

The diff is computed in a worker thread on its own store connection, so a long run does
not freeze the screen: a progress bar follows it, and `escape` leaves at once, the worker
stopping at its next batch of events. The rows then paint on one virtual widget, so one
scroll moves both sides; a row's two messages are read when the cursor reaches it."""

from __future__ import annotations

import threading
import time

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, ProgressBar, Static

from tttr.app import describe
from tttr.app.compare import Comparison, build_comparison, read_message
from tttr.app.screens.footer import FittedFooter
from tttr.app.screens.help import label_back
from tttr.app.widgets.side_by_side import MessagePair, SideBySide
from tttr.sessions.safe_text import brief
from tttr.sessions.vocabulary import LAYERS


class ComparisonReady(Message):
    def __init__(self, comparison: Comparison | None, error: str | None = None) -> None:
        super().__init__()
        self.comparison, self.error = comparison, error


class ComparisonProgress(Message):
    """How far the worker has read: `done` of `total` events of the two runs."""

    def __init__(self, done: int, total: int) -> None:
        super().__init__()
        self.done, self.total = done, total


class CompareScreen(FittedFooter, Screen):
    CSS_PATH = "../styles/compare.tcss"
    BINDINGS = [
        Binding("enter,a", "open_side('a')", "open left"),
        Binding("b", "open_side('b')", "open right"),
        Binding("f,F", "files", "files at this step"),
        Binding("escape", "back", "back"),
    ]
    place = "compare"  # what a screen above says `escape` goes back to

    def __init__(self, run_a: int, run_b: int) -> None:
        super().__init__()
        self.run_a, self.run_b = run_a, run_b
        self.comparison: Comparison | None = None
        self._cancel = threading.Event()  # set when the screen is left: the worker stops
        self._last_progress = 0.0

    def compose(self) -> ComposeResult:
        yield Static(Text(f"run #{self.run_a} ┃ run #{self.run_b}", style="bold"), id="compare-title")
        yield Static(Text(f"comparing run #{self.run_a} with run #{self.run_b} … (esc stops)", style="dim"),
                     id="compare-loading")
        yield ProgressBar(id="compare-progress", show_eta=False)
        yield SideBySide(id="side-by-side")
        yield MessagePair(id="compare-messages")
        yield Static("", id="compare-summary")
        yield Footer()

    def on_mount(self) -> None:
        label_back(self)
        self.query_one(SideBySide).display = False
        self.query_one(MessagePair).display = False
        self.run_worker(self._load, thread=True, exit_on_error=False, name="diff")

    def _load(self) -> None:
        from tttr.engine.replay.diff import ScanCancelled
        from tttr.sessions.store import Store

        try:
            store = Store.open(self.app.db_path, create=False, readonly=True)
            try:
                comparison = build_comparison(store, self.run_a, self.run_b, cancelled=self._cancel.is_set,
                                              progress=self._progress)
            finally:
                store.close()
        except ScanCancelled:
            return  # the screen was left: nobody to tell
        except Exception as exc:  # noqa: BLE001 - shown on screen
            self.post_message(ComparisonReady(None, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(ComparisonReady(comparison))

    def _progress(self, done: int, total: int) -> None:
        """From the worker: posted at most ten times a second, so the screen keeps its time for keys."""
        now = time.monotonic()
        if done in (0, total) or now - self._last_progress >= 0.1:
            self._last_progress = now
            self.post_message(ComparisonProgress(done, total))

    def on_comparison_progress(self, message: ComparisonProgress) -> None:
        self.query_one("#compare-progress", ProgressBar).update(total=message.total, progress=message.done)
        self.query_one("#compare-loading", Static).update(Text(
            f"comparing run #{self.run_a} with run #{self.run_b}: {message.done:,} of {message.total:,} "
            "events read … (esc stops)", style="dim"))

    def on_unmount(self) -> None:
        self._cancel.set()

    def on_comparison_ready(self, message: ComparisonReady) -> None:
        if self._cancel.is_set():
            return
        self.query_one("#compare-loading").display = False
        self.query_one("#compare-progress").display = False
        if message.comparison is None:
            self.query_one("#compare-summary", Static).update(
                Text(f"diff failed: {describe.short(message.error, 300)}", style="red"))
            return
        c = message.comparison
        store = self.app.store  # the worker's store is closed: messages are read from the app's
        c.read_message = lambda run_id, step: read_message(store, run_id, step)
        self.comparison = c
        self.refresh_bindings()  # the keys that need the rows (enter, b, f) are enabled now
        side = self.query_one(SideBySide)
        side.display = True
        side.show(c)
        side.focus()
        self.query_one(MessagePair).display = True
        self._show_messages(side.rows[side.cursor] if side.rows else None)
        self.query_one("#compare-title", Static).update(self._title(c))
        self.query_one("#compare-summary", Static).update(self._summary(c))

    def _title(self, c: Comparison) -> Text:
        """Both runs on the title's line: the left in at most half of it, the right in what
        is left, so that a long lineage (a fork's new value) never pushes the right run and
        its outcome off a narrow screen."""
        store = self.app.store
        text = Text()
        width = max(40, self.app.size.width - 2)  # the title's padding
        for side, run_id in (("left", c.run_a), ("right", c.run_b)):
            if side == "right":
                text.append("    ")
            head = f"{side}: #{run_id} "
            room = (width // 2 - 4 if side == "left" else width - len(text.plain)) - len(head)
            text.append(head, style="bold")
            try:
                run = store.run(run_id)
            except Exception as exc:  # noqa: BLE001 - the title says so; the rows still show
                text.append(describe.short(exc, max(8, room)), style="red")
                continue
            label = describe.outcome_label(run)
            text.append(describe.short(describe.lineage(run), max(8, room - len(label.plain) - 1)) + " ", style="dim")
            text.append_text(label)
        return text

    def _summary(self, c: Comparison) -> Text:
        text = Text()
        if c.fork_site:
            text.append("⋔ fork ", style="bold magenta")
            text.append(f"at {describe.short(c.fork_site, 40)} = {describe.mutation_label(c.mutation)}")
            token_id = c.mutation.get("value") if isinstance(c.mutation, dict) else None
            if ":token:" in c.fork_site and isinstance(token_id, int):
                model_id = self.app.store.run(c.run_b).model_id
                name = self.app.token_texts([token_id], model_id).get(token_id)
                if name is None:  # no tokenizer here: the text the fork recorded for it
                    name = c.token_texts(c.fork_site)[1]
                if name is not None:
                    text.append(f"  (token {token_id} = {describe.token_text(name)})", style="dim")
            text.append("\n")
        if c.note is not None:
            text.append("✗ the runs cannot be diffed site by site: ", style="bold red")
            text.append(describe.short(c.note, 200) + "\n", style="red")
            text.append("steps are aligned by their actions; unreadable ones are marked ✗", style="dim")
            return text
        text.append_text(self._outcomes(c))
        first = c.first
        if first is None and c.at_fork is None:
            text.append("identical: no site differs between the two runs", style="bold green")
            return text
        if first is None:
            at = c.at_fork
            more = c.differing_sites.get(at.layer, 1) - 1  # later values the edit moved (a setup clock's)
            text.append("▶ the runs diverge at the fork only " if not more else "▶ the runs diverge from the fork ",
                        style="bold red")
            text.append(f"{describe.short(at.site, 40)} ({describe.short(at.layer, 10)}): {self._pair(c, at)}; "
                        + (f"{more} later {describe.short(at.layer, 10)} site{'s' if more > 1 else ''} differ"
                           " with it, " if more else "") + "no other layer differs\n")
        else:
            text.append("▶ first divergence " + ("after the fork " if c.fork_site else ""), style="bold red")
            text.append(f"{describe.short(first.site, 40)} ({describe.short(first.layer, 10)}): "
                        f"{self._pair(c, first)}\n")
        for layer in LAYERS:
            d = c.divergences.get(layer)
            if d is not None:
                text.append(f"  {layer:<7}", style="bold")
                more = c.differing_sites.get(layer, 1) - 1
                text.append(f"first differs at {describe.short(d.site, 40)}: {self._pair(c, d)}"
                            + (f" · {more} more differing site{'s' if more > 1 else ''}" if more > 0 else "")
                            + "\n", style="dim")
        differing = sum(1 for r in c.rows if not r.same)
        text.append(f"{differing} of {len(c.rows)} aligned rows differ · n/p next/previous difference", style="dim")
        return text

    @staticmethod
    def _pair(c: Comparison, d) -> str:
        """A divergence's two values as a person reads them: a token as its recorded text."""
        texts = c.token_texts(d.site) if d.layer == "token" else (None, None)
        sides = [d.shown(side, 50) if t is None or d.absent == side else describe.token_with_id(t, brief(v, 12))
                 for side, v, t in zip("ab", (d.a, d.b), texts)]
        return f"{sides[0]} → {sides[1]}"

    def _outcomes(self, c: Comparison) -> Text:
        """Each run's outcome; said in words when the same actions ended differently. When
        both do not fit on one line (80 columns), the right run's (a fork's) gets its own."""
        text = Text("outcome ", style="bold")
        sides = []
        for side, run_id, outcome in (("left", c.run_a, c.outcome_a), ("right", c.run_b, c.outcome_b)):
            part = Text(f"{side} #{describe.short(run_id, 12)} ")
            part.append_text(describe.outcome_line(outcome))
            sides.append(part)
        text.append(" ")
        text.append_text(sides[0])
        one_line = len(text.plain) + 3 + len(sides[1].plain) <= max(40, self.app.size.width - 2)
        text.append("   " if one_line else "\n" + " " * len("outcome  "))
        text.append_text(sides[1])
        passed = [o.passed if o is not None else None for o in (c.outcome_a, c.outcome_b)]
        steps = [r for r in c.rows if not any(s is not None and s.step < 0 for s in (r.a, r.b))]
        if None not in passed and passed[0] != passed[1] and all(r.same for r in steps):
            text.append("\n  the same actions led to a different outcome", style="bold yellow")
        text.append("\n")
        return text

    def on_side_by_side_row_selected(self, message: SideBySide.RowSelected) -> None:
        self._show_messages(message.row)

    def _show_messages(self, row) -> None:
        if self.comparison is None:
            return
        diff = self.comparison.message_diff(row) if row is not None else None
        self.query_one(MessagePair).show(diff, row)

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """While the comparison loads, the keys that need its rows are shown disabled."""
        if action in ("open_side", "files") and self.comparison is None:
            return None
        return True

    def action_open_side(self, side: str) -> None:
        side_widget = self.query_one(SideBySide)
        if self.comparison is None or not side_widget.rows:
            return
        row = side_widget.rows[side_widget.cursor]
        info = row.a if side == "a" else row.b
        run_id = self.run_a if side == "a" else self.run_b
        self.app.open_run(run_id, step=info.step if info is not None else None)

    def action_files(self) -> None:
        """The files of both runs after the row's step, marked from left to right."""
        from tttr.app.screens.files import FilesScreen, TreeRef

        side_widget = self.query_one(SideBySide)
        if self.comparison is None or not side_widget.rows:
            return
        row = side_widget.rows[side_widget.cursor]
        step_a = (row.a or row.b).step
        step_b = (row.b or row.a).step
        self.app.push_screen(FilesScreen(TreeRef(self.run_b, step_b), TreeRef(self.run_a, step_a)))

    def action_back(self) -> None:
        self._cancel.set()  # a comparison still loading stops at its next batch of events
        self.app.pop_screen()
