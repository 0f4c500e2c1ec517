"""The timing of a run's steps (`t` on the timeline), as a performance panel draws frames:
per step, the model's time, the tool's time and the wait (the host's own work between
them), each as a bar on one scale, with the figures and their totals. A run recorded
without per-step timings (an older file, an imported trace) shows what its events hold
instead (the tokens generated, each command's duration) and says so in one line."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Static

from tttr.app import describe
from tttr.app.steps import TIMING_LACKS, StepTiming, timings_recorded

BAR = 16  # cells of the longest bar
PARTS = (("model", "model_ms", "cyan"), ("tool", "tool_ms", "yellow"), ("wait", "wait_ms", "magenta"))
TIMED_NOTE = ("model: generating the step's message (prefill and decode, or taking the recorded tokens) · tool: "
              "its command or tool · wait: the rest of the step (the host's or the program's own work); "
              "measured on the host that recorded the run")


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"


EIGHTHS = " ▏▎▍▌▋▊▉"


def _bar(value: float | None, top: float, width: int) -> str:
    """`value` on a scale where `top` fills `width` cells, to an eighth of a cell; a part
    that took any time shows at least an eighth, so that it is never hidden by the scale."""
    eighths = round(8 * width * (value or 0) / top)
    if value and not eighths:
        eighths = 1
    full, part = divmod(min(eighths, 8 * width), 8)
    return f"{'█' * full + (EIGHTHS[part] if part else ''):<{width}}"


def timing_text(timings: list[StepTiming], width: int = BAR) -> Text:
    """The table: with recorded timings, step, tokens, model / tool / wait ms (bars on one
    scale) and the command; without, step, tokens (bar), command ms (bar), command."""
    if not timings_recorded(timings):
        return _untimed_text(timings, width)
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{'step':>5} {'tokens':>6}", style="bold")
    for name, _, _ in PARTS:
        text.append(f" {name + ' ms':>9} {'':<{width}}", style="bold")
    text.append(" command\n", style="bold")
    top = max((getattr(t, field) or 0 for t in timings for _, field, _ in PARTS), default=0) or 1
    for t in timings:
        text.append(f"{describe.step_label(t.step):>5} {t.tokens:>6}")
        for _, field, style in PARTS:
            value = getattr(t, field)
            text.append(f" {_ms(value):>9} ")
            text.append(_bar(value, top, width), style=style)
        text.append(" ")
        text.append_text(describe.safe(describe.short(t.command, 60), one_line=True))
        text.append("\n")
    totals = {name: sum(getattr(t, field) or 0 for t in timings) for name, field, _ in PARTS}
    text.append(f"\n{sum(totals.values()):,.1f} ms in all: ", style="bold")
    text.append(" · ".join(f"{name} {ms:,.1f}" for name, ms in totals.items()), style="bold")
    text.append(f" · {sum(t.tokens for t in timings):,} tokens\n", style="bold")
    return text


def _untimed_text(timings: list[StepTiming], width: int) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{'step':>5}  {'tokens':>6} {'':<{width}}  {'tool ms':>8} {'':<{width}}  command\n", style="bold")
    top_tokens = max((t.tokens for t in timings), default=0) or 1
    top_ms = max((t.tool_ms or 0 for t in timings), default=0) or 1
    for t in timings:
        text.append(f"{describe.step_label(t.step):>5}  ")
        text.append(f"{t.tokens:>6} ")
        text.append(f"{'█' * round(width * t.tokens / top_tokens):<{width}}", style="cyan")
        text.append(f"  {_ms(t.tool_ms):>8} ")
        text.append(_bar(t.tool_ms, top_ms, width), style="yellow")
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
    BINDINGS = [
        Binding("escape,t,q", "close", "close"),
        # Without the scroll's animation: each of its frames repaints the table (a step per row), which cost
        # ~160 ms of CPU per key on a run of 207 steps.
        Binding("pagedown,space", "scroll('page_down')", show=False),
        Binding("pageup", "scroll('page_up')", show=False),
        Binding("down,j", "scroll('down')", show=False),
        Binding("up,k", "scroll('up')", show=False),
        Binding("end,G", "scroll('end')", show=False),
        Binding("home,g", "scroll('home')", show=False),
    ]

    def __init__(self, run_id: int) -> None:
        super().__init__()
        self.run_id = run_id
        self.timings: list[StepTiming] | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="timing-dialog", can_focus=False):  # the screen's keys scroll it, unanimated
            yield Static(Text(f"run #{self.run_id}: reading the steps' timings …", style="italic"), id="timing")
            yield Static(Text("", style="dim"), id="timing-note")  # wraps, unlike the table

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
        timed = timings_recorded(message.timings)
        inside = min(110, self.app.size.width * 98 // 100) - 4  # the dialog's width, less border and padding
        # narrower bars on a narrow terminal, leaving the command a dozen cells
        bar = max(3, min(12, (inside - 55) // 3)) if timed else max(4, min(BAR, (self.app.size.width - 60) // 2))
        shown.update(head + timing_text(message.timings, bar))
        self.query_one("#timing-note", Static).update(Text(TIMED_NOTE if timed else TIMING_LACKS, style="dim"))

    def action_scroll(self, where: str) -> None:
        dialog = self.query_one("#timing-dialog", VerticalScroll)
        getattr(dialog, f"scroll_{where}")(animate=False)

    def action_close(self) -> None:
        self.dismiss(None)
