"""The timing of a run's steps (`t` on the timeline), as a performance panel draws frames:
per step, the tokens the model generated and the command's duration, each as a bar. What
the record does not hold (the model's time, the wait between steps) is said, not guessed."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Static

from tttr.app import describe
from tttr.app.steps import TIMING_LACKS, StepTiming

BAR = 16  # cells of the longest bar


def timing_text(timings: list[StepTiming], width: int = BAR) -> Text:
    """The table: step, tokens (bar), command ms (bar), command."""
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{'step':>5}  {'tokens':>6} {'':<{width}}  {'tool ms':>8} {'':<{width}}  command\n", style="bold")
    top_tokens = max((t.tokens for t in timings), default=0) or 1
    top_ms = max((t.tool_ms or 0 for t in timings), default=0) or 1
    for t in timings:
        text.append(f"{describe.step_label(t.step):>5}  ")
        text.append(f"{t.tokens:>6} ")
        text.append(f"{'█' * round(width * t.tokens / top_tokens):<{width}}", style="cyan")
        ms = "—" if t.tool_ms is None else f"{t.tool_ms:,.1f}"
        text.append(f"  {ms:>8} ")
        text.append(f"{'█' * round(width * (t.tool_ms or 0) / top_ms):<{width}}", style="yellow")
        text.append("  ")
        text.append_text(describe.safe(describe.short(t.command, 60), one_line=True))
        text.append("\n")
    total = sum(t.tool_ms or 0 for t in timings)
    text.append(f"\n{sum(t.tokens for t in timings):,} tokens · commands {total:,.1f} ms in all\n", style="bold")
    return text


class TimingsRead(Message):
    """The worker read the timings (or `error` says why not)."""

    def __init__(self, timings: list[StepTiming] | None, error: str = "") -> None:
        super().__init__()
        self.timings, self.error = timings, error


class TimingScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,t,q", "close", "close")]

    def __init__(self, run_id: int) -> None:
        super().__init__()
        self.run_id = run_id
        self.timings: list[StepTiming] | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="timing-dialog"):
            yield Static(Text(f"run #{self.run_id}: reading the steps' timings …", style="italic"), id="timing")
            yield Static(Text(TIMING_LACKS, style="dim"), id="timing-note")  # wraps, unlike the table

    def on_mount(self) -> None:
        self.run_worker(self._read, thread=True, exit_on_error=False, name="timings")

    def _read(self) -> None:
        """In a worker, on a connection of its own (one pass over the run's rows)."""
        from tttr.app.steps import step_timings
        from tttr.sessions.store import Store

        try:
            store = Store.open(self.app.db_path, create=False, readonly=True)
            try:
                timings = step_timings(store, self.run_id)
            finally:
                store.close()
        except Exception as exc:  # noqa: BLE001 - said in the dialog
            # Posted, not called: a call from this thread would wait forever on an app that quit.
            self.post_message(TimingsRead(None, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(TimingsRead(timings))

    def on_timings_read(self, message: TimingsRead) -> None:
        shown = self.query_one("#timing", Static)
        if message.timings is None:
            shown.update(Text(f"the timings cannot be read: {message.error}", style="bold red"))
            return
        self.timings = message.timings
        head = Text(f"run #{self.run_id} · timing of its steps\n\n", style="bold", no_wrap=True)
        bar = max(4, min(BAR, (self.app.size.width - 60) // 2))  # narrower bars on a narrow terminal
        shown.update(head + timing_text(message.timings, bar))

    def action_close(self) -> None:
        self.dismiss(None)
