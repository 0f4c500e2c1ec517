"""The timeline screen: one run's events, the detail of the one under the cursor, the
step's message as text, and edit-and-fork. It coordinates its widgets: they post what
happened (EventSelected), it sets what they show."""

from __future__ import annotations

import json
import threading
from functools import partial

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Static

from app import describe
from app.forking import ForkFailed, ForkFinished, ForkProgressed, run_fork
from app.runview import EDITABLE_KINDS, LAYERS, RunView, token_pos
from app.screens.edit import EditScreen
from app.screens.search import SearchScreen
from app.widgets.detail import DetailPane
from app.widgets.fork_progress import ForkProgress
from app.widgets.message import MessageStrip
from app.widgets.timeline import Timeline


class TimelineScreen(Screen):
    BINDINGS = [
        Binding("e", "edit", "edit & fork"),
        Binding("slash", "search", "search"),
        Binding("d", "diff_parent", "diff vs parent"),
        Binding("x", "cancel_fork", "cancel fork"),
        Binding("escape", "back", "back to runs"),
    ]

    def __init__(self, view: RunView, *, start: int = 0) -> None:
        super().__init__()
        self.view = view
        self.start = start
        self.corpus = None
        self.fork_cancel: threading.Event | None = None
        self.message_shown: tuple[int, int | None] | None = None

    def compose(self) -> ComposeResult:
        yield Static(self._title("token"), id="run-title")
        with Horizontal(id="timeline-body"):
            yield Timeline(self.view, id="timeline")
            yield DetailPane(id="detail")
        yield MessageStrip(id="message")
        progress = ForkProgress(id="fork-progress")
        progress.display = False
        yield progress
        yield Footer()

    def _title(self, layer: str) -> Text:
        run = self.view.run
        text = self._layer_label(layer)
        text.append("  ")
        text.append(describe.run_title(run), style="bold")
        text.append("  ")
        text.append_text(describe.status_label(run))
        text.append(" ")
        text.append_text(describe.outcome_label(run))
        text.append(f"  {self.view.count} events · {describe.lineage(run)}", style="dim")
        return text

    @staticmethod
    def _layer_label(layer: str) -> Text:
        letter, colour = LAYERS[layer]
        return Text(f", . step through {letter} {layer}", style=f"bold {colour}")

    def on_mount(self) -> None:
        timeline = self.query_one(Timeline)
        timeline.focus()
        if self.start:
            timeline.cursor = self.start

    def token_texts(self, ids: list[int]) -> dict[int, str]:
        return self.app.token_texts(ids, self.view.run.model_id)

    @property
    def timeline(self) -> Timeline:
        return self.query_one(Timeline)

    @property
    def current(self):
        return self.view.event(self.timeline.cursor)

    # -- the cursor moved: set what the panes show ---------------------------------------
    def on_timeline_event_selected(self, message: Timeline.EventSelected) -> None:
        event = self.view.event(message.index)
        if event is None:
            return
        self.query_one(DetailPane).show(describe.detail(self.view, event, self.token_texts))
        pos = token_pos(event) if event.kind in ("token", "logits") else None
        if self.message_shown != (event.step, pos):
            self.message_shown = (event.step, pos)
            self.query_one(MessageStrip).show_tokens(event.step, self.view.step_tokens(event.step), pos)

    def on_timeline_layer_chosen(self, message: Timeline.LayerChosen) -> None:
        self.query_one("#run-title", Static).update(self._title(message.layer))

    def refresh_token_texts(self) -> None:
        """The tokenizer arrived: name the top-k alternatives of the current token."""
        self.on_timeline_event_selected(Timeline.EventSelected(self.timeline, self.timeline.cursor))

    # -- search -------------------------------------------------------------------------
    def action_search(self) -> None:
        if self.corpus is None:
            from app.search import build_corpus

            self.corpus = build_corpus(self.view)
        self.app.push_screen(SearchScreen(self.corpus), self._jump_to_hit)

    def _jump_to_hit(self, seq: int | None) -> None:
        if seq is not None:
            self.timeline.cursor = seq
            self.timeline.focus()

    # -- edit and fork -----------------------------------------------------------------
    def action_edit(self) -> None:
        event = self.current
        if event is None:
            return
        if event.kind not in EDITABLE_KINDS:
            self.notify(
                f"a {event.kind} event cannot be edited: move to a clock or tool event (R) or a token (K)",
                severity="warning",
            )
            return
        if self.fork_cancel is not None:
            self.notify("a fork is already running: wait for it, or press x to cancel it", severity="warning")
            return
        alternatives = []
        if event.kind == "token":
            alternatives = describe.alternatives(self.view, event, self.token_texts)
        self.app.push_screen(
            EditScreen(event.site, event.kind, editable_text(self.view, event),
                       partial(self.validate_edit, event.site), alternatives),
            partial(self.start_fork, event.site),
        )

    def validate_edit(self, site: str, text: str) -> str | None:
        """None when `text` is a valid new value for `site`, else why not."""
        run = self.view.run
        if run.status != "complete":
            return f"run #{run.id} is {run.status}: only complete runs can be forked"
        try:
            from engine.mutation import parse_mutation
        except ImportError as exc:
            return f"editing needs the engine, which failed to import: {exc}"
        tokenizer = None
        if ":token:" in site:
            tokenizer = self.app.tokenizer_for(run.model_id)
            if tokenizer is None:
                return (f"run #{run.id} was recorded with model {run.model_id}, which is not the model "
                        "at hand: start the app with --model pointing at it (or set TTTR_MODEL)")
        try:
            parse_mutation(self.view.store, run.id, site, text, tokenizer=tokenizer)
        except Exception as exc:  # noqa: BLE001 - the engine's reason is the message to show
            if getattr(exc, "exit_code", None) is None and not isinstance(exc, ValueError):
                raise
            return str(exc)
        return None

    def start_fork(self, site: str, value: str | None) -> None:
        if value is None:
            return
        self.fork_cancel = cancel = threading.Event()
        self.query_one(ForkProgress).start(site, value)
        self.refresh_bindings()
        self.run_worker(partial(self._fork, site, value, cancel), thread=True, group="fork",
                        exit_on_error=False, name=f"fork {site}")

    def _fork(self, site: str, value: str, cancel: threading.Event) -> None:
        """In a worker thread: run the fork and report by message."""
        parent = self.view.run_id

        def progress(done, total, text=""):
            self.post_message(ForkProgressed(done, total, text))

        try:
            progress(0, None, "loading the model …")
            runtime = self.app.runtime()
            result = run_fork(self.app.db_path, parent, site, value, runtime=runtime,
                              unsafe_no_sandbox=self.app.unsafe_no_sandbox, progress=progress, cancel=cancel)
        except Exception as exc:  # noqa: BLE001 - reported on screen, the app keeps running
            detail = str(exc) if getattr(exc, "exit_code", None) is not None else f"{type(exc).__name__}: {exc}"
            self.post_message(ForkFailed(site, detail))
            return
        self.post_message(ForkFinished(parent, site, value, result, cancel.is_set()))

    def on_fork_progressed(self, message: ForkProgressed) -> None:
        if self.fork_cancel is not None and not self.fork_cancel.is_set():
            self.query_one(ForkProgress).advance(message.done, message.total, message.text)

    def on_fork_failed(self, message: ForkFailed) -> None:
        self._fork_done()
        self.notify(f"fork at {message.site} failed: {message.error}", severity="error", timeout=10)

    def on_fork_finished(self, message: ForkFinished) -> None:
        self._fork_done()
        result = message.result
        if message.cancelled or result.status != "complete":
            self.notify(f"fork cancelled: run #{result.run_id} is stored {result.status}", severity="warning")
            return
        self.notify(f"fork at {message.site} stored as run #{result.run_id}")
        from app.screens.compare import CompareScreen

        self.app.push_screen(CompareScreen(message.parent, result.run_id))

    def _fork_done(self) -> None:
        self.fork_cancel = None
        self.query_one(ForkProgress).stop()
        self.refresh_bindings()

    def on_unmount(self) -> None:
        # Leaving the screen (or quitting) stops a running fork at its next step, so no
        # worker outlives the screen that would show its result; the run is kept incomplete.
        if self.fork_cancel is not None:
            self.fork_cancel.set()

    def action_cancel_fork(self) -> None:
        if self.fork_cancel is not None:
            self.fork_cancel.set()
            self.query_one(ForkProgress).stopping()

    def action_diff_parent(self) -> None:
        from app.screens.compare import CompareScreen

        self.app.push_screen(CompareScreen(self.view.run.parent, self.view.run_id))

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "cancel_fork":
            return self.fork_cancel is not None
        if action == "diff_parent":
            return self.view.run.parent is not None
        return True

    def action_back(self) -> None:
        self.app.pop_screen()


def editable_text(view: RunView, event) -> str:
    """The recorded value as the edit dialog shows it (the syntax parse_mutation takes)."""
    value = event.value if isinstance(event.value, dict) else {}
    if event.kind == "clock":
        return str(value.get("t", ""))
    if event.kind == "token":
        return json.dumps(str(value.get("text", "")), ensure_ascii=False)
    # JSON keeps newlines editable on one line, and is a form parse_mutation takes.
    return json.dumps({"stdout": view.text(value.get("stdout")), "exit_code": value.get("exit_code")},
                      ensure_ascii=False)
