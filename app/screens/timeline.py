"""The timeline screen: one run's events, the detail of the one under the cursor, the
step's message as text, and edit-and-fork. It coordinates its widgets: they post what
happened (EventSelected), it sets what they show."""

from __future__ import annotations

import threading
from functools import partial

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.message import Message
from textual.worker import get_current_worker
from textual.binding import Binding
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import Footer, Static

from tttr.app import describe
from tttr.app.runview import (RunView, token_pos)
from tttr.app.exporting import ask_export
from tttr.app.navigation import GOTO_HELP, goto_target, names_step, next_in, token_context, value_text
from tttr.app.screens.ask import AskScreen
from tttr.app.screens.search import SearchScreen
from tttr.app.screens.timeline_fork import EditAndFork
from tttr.app.screens.footer import FittedFooter
from tttr.app.screens.help import label_back
from tttr.app.widgets.detail import DetailPane
from tttr.app.widgets.fork_progress import ForkProgress
from tttr.app.widgets.message import MessageStrip
from tttr.app.widgets.timeline import Timeline
from tttr.sessions.safe_text import visible
from tttr.sessions.vocabulary import site


class BlobsLoaded(Message):
    """A worker read blobs the detail pane was waiting for: {key: text or file changes}."""

    def __init__(self, loaded: dict) -> None:
        super().__init__()
        self.loaded = loaded


class CorpusBuilt(Message):
    """The search index of the run is built (corpus None: it failed, with `error`)."""

    def __init__(self, dialog: SearchScreen, corpus, error: str | None = None) -> None:
        super().__init__()
        self.dialog, self.corpus, self.error = dialog, corpus, error


class CommandBlamed(Message):
    """Where a command's input file came from (`engine.blame.Blame`), or why that is not known."""

    def __init__(self, blame, error: str | None) -> None:
        super().__init__()
        self.blame, self.error = blame, error


FOLLOW_S = 0.5  # how often a run still being recorded is read again


class TimelineScreen(FittedFooter, EditAndFork, Screen):
    BINDINGS = [
        Binding("e", "edit", "edit & fork"),
        Binding("slash", "search", "search"),
        Binding("d", "diff_parent", "diff vs parent"),
        Binding("x", "cancel_fork", "cancel fork"),
        Binding("f", "filter", "filter"),
        Binding("F", "files", "files at this step"),
        Binding("t", "timing", "timing of the steps", show=False),
        Binding("b", "blame", "who wrote the file this command reads", show=False),
        Binding("p", "token_context", "on a token: the prompt and tokens it was conditioned on", show=False),
        # like a debugger: go to, search matches, bookmarks, copy, export (docs/reference.md)
        Binding("colon", "goto", "go to event/step/site", show=False),
        Binding("n", "search_next", "next search match", show=False),
        Binding("N", "search_prev", "previous search match", show=False),
        Binding("m", "bookmark", "bookmark / unbookmark", show=False),
        Binding("apostrophe", "next_bookmark", "next bookmark", show=False),
        Binding("quotation_mark", "prev_bookmark", "previous bookmark", show=False),
        Binding("y", "copy", "copy value", show=False),
        Binding("w", "export", "export run", show=False),
        Binding("tab", "switch_pane", "timeline ⇄ detail pane (scroll it with ↑↓ pgup pgdn)", show=False),
        Binding("escape", "back", "back to runs"),
    ]

    # A short or narrow terminal (80x24) gets a smaller message strip (and a compact footer: FittedFooter).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]

    def __init__(self, view: RunView, *, start: int = 0, event: int | None = None) -> None:
        super().__init__()
        self.view = view
        self.start = start
        self.event = event  # an event to open at (its step expanded), rather than a step
        self.corpus = None
        self.fork_cancel: threading.Event | None = None
        self.message_shown: tuple[int, int | None] | None = None
        self.search_query = ""
        self.search_seqs: list[int] = []  # the events the last search matched, in seq order
        self.context_at: tuple[int, int] | None = None  # (step, position): `p`'s token, while its prompt is shown

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="run-title")
        with Horizontal(id="timeline-body"):
            yield Timeline(self.view, bookmarks=self.app.bookmarks.setdefault(self.view.run_id, set()),
                           id="timeline")
            yield DetailPane(id="detail")
        yield MessageStrip(id="message")
        progress = ForkProgress(id="fork-progress")
        progress.display = False
        yield progress
        yield Footer()

    def _title(self) -> Text:
        run = self.view.run
        # Its state first: on a narrow terminal the line is cut at its end, and a model's name is long.
        text = Text(f"run #{describe.short(run.id, 12)}  ", style="bold")
        text.append_text(describe.status_label(run))
        text.append(" ")
        text.append_text(describe.outcome_label(run))
        text.append(" · " + describe.run_facts(run), style="bold")
        text.append(f"  {self.view.count} events · {describe.lineage(run)}", style="dim")
        problem = describe.run_problem(run)
        if problem is not None:
            text.append("  ")
            text.append_text(problem)
        return text

    def on_mount(self) -> None:
        label_back(self)
        timeline = self.query_one(Timeline)
        timeline.focus()
        if self.event is not None:
            timeline.cursor = self.event
            self.call_after_refresh(timeline.scroll_to_cursor)
        elif self.start:
            timeline.go_to_step(self.start)  # opened at a step (a compare's `enter`/`b`): its row
            # Laid out only after this: scroll the rows to the cursor once they have a height.
            self.call_after_refresh(timeline.scroll_to_cursor)
        if self.view.run.status == "recording":
            self.following = self.set_interval(FOLLOW_S, self.follow)

    def follow(self) -> None:
        """A run still being recorded grows on screen, like `tail -f`: the steps its
        recorder commits appear below, the cursor stays, and the header says `recording`
        until the run ends."""
        try:
            grown = self.view.grow()
        except Exception:  # noqa: BLE001 - the file went away: keep what is shown
            grown = False
        if self.view.run.status != "recording":
            self.following.stop()
        if grown:
            timeline = self.timeline
            timeline.rows.reload()
            timeline.reshape()
            timeline.forget()  # the last step's bracket closes differently with new events below it
            self.query_one("#run-title", Static).update(self._title())

    def token_texts(self, ids: list[int]) -> dict[int, str]:
        return self.app.token_texts(ids, self.view.run.model_id)

    @property
    def place(self) -> str:
        """What a screen above says `escape` goes back to."""
        return f"run #{self.view.run_id}"

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
        if self.context_at is not None and (event.kind != "prompt" or event.step != self.context_at[0]):
            self.context_at = None  # the cursor left the prompt `p` went to
        self._show_detail(event)
        pos = token_pos(event) if event.kind in ("token", "logits") else None
        if self.context_at is not None:
            pos = self.context_at[1]  # the strip marks the token whose context is shown
        if self.message_shown != (event.step, pos):
            self.message_shown = (event.step, pos)
            self.query_one(MessageStrip).show_tokens(event.step, self.view.step_tokens(event.step), pos)

    def _show_detail(self, event) -> None:
        """The detail of `event`, from what is loaded; blobs it needs (outputs, snapshots)
        load in a worker, and the pane shows placeholders until they arrive. On a collapsed
        step's row: a line saying so above the detail of what the step did."""
        prompt = self.app.prompt_of(self.view.run, event.step) if event.kind == "prompt" else None
        shown = describe.detail(self.view, event, self.token_texts, prompt)
        timeline = self.timeline
        if timeline.on_step_row:
            rows = timeline.rows
            i = rows.index_of(event.seq)
            shown = Group(Text(f"step {describe.step_label(rows.steps[i])}: {rows.events_in(i)} events "
                               "(space shows them, z every step's)", style="bold reverse"), shown)
        if self.context_at is not None and event.kind == "prompt" and event.step == self.context_at[0]:
            tokens = self.view.step_tokens(event.step)
            shown = Group(token_context(event, prompt, tokens, self.context_at[1]), Text(""), shown)
        self.query_one(DetailPane).show(shown)
        wanted = self.view.take_wanted()
        if wanted:
            self.run_worker(partial(self._load_blobs, wanted), thread=True, exclusive=True, group="blobs",
                            exit_on_error=False, name="blobs")

    def _load_blobs(self, wanted: dict) -> None:
        """In a worker thread, on a connection of its own: read the wanted blobs (a slow or
        huge one never blocks the screen; `q` still quits)."""
        from tttr.app.runview import load_wanted
        from tttr.sessions.store import Store

        worker = get_current_worker()
        try:
            store = Store.open(self.app.db_path, create=False, readonly=True)
        except Exception as exc:  # noqa: BLE001 - shown where the blob would be
            loaded = {key: f"‹cannot read the database: {exc}›" for key, what in wanted.items()
                      if not isinstance(what, tuple)}
        else:
            try:
                loaded = load_wanted(store, wanted)
            except Exception as exc:  # noqa: BLE001 - shown where the blob would be
                loaded = {key: f"‹cannot read: {exc}›" for key, what in wanted.items() if not isinstance(what, tuple)}
            finally:
                store.close()
        if not worker.is_cancelled:
            self.post_message(BlobsLoaded(loaded))

    def on_blobs_loaded(self, message: BlobsLoaded) -> None:
        self.view.merge_loaded(message.loaded)
        event = self.current
        if event is not None:
            self._show_detail(event)

    def refresh_detail(self) -> None:
        """Something the detail pane shows arrived (a prompt's text): show it again."""
        event = self.current
        if event is not None:
            self._show_detail(event)

    def refresh_token_texts(self) -> None:
        """The tokenizer arrived: name the top-k alternatives of the current token."""
        self.on_timeline_event_selected(Timeline.EventSelected(self.timeline, self.timeline.cursor))

    # -- search -------------------------------------------------------------------------
    def action_search(self) -> None:
        screen = SearchScreen(self.corpus, self.search_query)
        if self.corpus is None:
            self.run_worker(partial(self._index, screen), thread=True, exclusive=True, group="index",
                            exit_on_error=False, name="search index")
        self.app.push_screen(screen, partial(self._jump_to_hit, screen))

    def _index(self, screen: SearchScreen) -> None:
        """In a worker thread, on a connection of its own: the search corpus (it reads
        every command's output, blobs included)."""
        from tttr.app.search import build_corpus
        from tttr.sessions.store import Store

        # Posted, not called: a call from this thread would wait forever on an app that quit.
        try:
            store = Store.open(self.app.db_path, create=False, readonly=True)
            try:
                corpus = build_corpus(RunView(store, self.view.run_id), self.app.prompts_for_search(store, self.view.run))
            finally:
                store.close()
        except Exception as exc:  # noqa: BLE001 - shown in the dialog
            self.post_message(CorpusBuilt(screen, None, f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(CorpusBuilt(screen, corpus))

    def on_corpus_built(self, message: CorpusBuilt) -> None:
        if message.corpus is None:
            message.dialog.index_failed(message.error or "")
            return
        self.corpus = message.corpus
        message.dialog.set_corpus(message.corpus)

    def _jump_to_hit(self, screen: SearchScreen, seq: int | None) -> None:
        if seq is not None:
            from tttr.app.search import search

            self.search_query = screen.query_text
            self.search_seqs = sorted({hit.entry.seq for hit in search(screen.corpus or [], self.search_query,
                                                                       limit=None)})
            self.timeline.cursor = seq
            self.timeline.focus()

    def action_search_next(self, forward: bool = True) -> None:
        """`n`/`N`: the next (previous) event the last search matched, wrapping like vim."""
        if not self.search_query:
            self.timeline.nowhere("no search yet: press / to search")
            return
        seq, wrapped = next_in(self.search_seqs, self.timeline.cursor, forward)
        if seq is None:
            self.timeline.nowhere(f"no match for {describe.short(self.search_query, 40)!r}")
            return
        self.timeline.go_to(seq, f"the only match for {describe.short(self.search_query, 40)!r} is here")
        if wrapped:
            self.notify(f"search wrapped to the {'first' if forward else 'last'} match", timeout=2, markup=False)

    def action_search_prev(self) -> None:
        self.action_search_next(forward=False)

    # -- go to, bookmarks, copy, export -------------------------------------------------
    def action_goto(self) -> None:
        def check(text: str) -> tuple[int, bool]:
            return goto_target(self.view, text, cursor=self.timeline.cursor), names_step(text)

        self.app.push_screen(AskScreen("Go to", GOTO_HELP, check), self._went)

    def _went(self, answer: tuple[int, bool] | None) -> None:
        if answer is not None:
            index, step = answer
            if step:  # `s3`, `setup`: the step, as the tree shows it
                self.timeline.go_to_step(index)
            else:
                self.timeline.go_to(index, f"already at event {index}")
            self.timeline.focus()

    def action_bookmark(self) -> None:
        marked = self.timeline.toggle_bookmark()
        count = len(self.timeline.bookmarks)
        self.notify(f"{'bookmarked' if marked else 'unbookmarked'} event {self.timeline.cursor} "
                    f"({count} bookmark{'s' if count != 1 else ''} in this run; ' jumps between them)",
                    timeout=2, markup=False)

    def action_next_bookmark(self, forward: bool = True) -> None:
        seq, wrapped = next_in(sorted(self.timeline.bookmarks), self.timeline.cursor, forward)
        if seq is None:
            self.timeline.nowhere("no bookmarks in this run: m bookmarks the event under the cursor")
            return
        self.timeline.go_to(seq, "the only bookmark is here")
        if wrapped:
            self.notify(f"back to the {'first' if forward else 'last'} bookmark", timeout=2, markup=False)

    def action_prev_bookmark(self) -> None:
        self.action_next_bookmark(forward=False)

    def action_copy(self) -> None:
        """Copy the value under the cursor: to the terminal's clipboard (OSC 52, where the
        terminal supports it) and, since not every terminal does, to a file as well."""
        event = self.current
        if event is None:
            return
        prompt = self.app.prompt_of(self.view.run, event.step) if event.kind == "prompt" else None
        text = value_text(self.view, event, prompt)
        if text is None:
            self._show_detail(event)  # (re)starts its loading
            self.notify("the value is still loading: press y again in a moment", severity="warning", markup=False)
            return
        self.app.copy_to_clipboard(text)
        from tttr.sessions.cache import cache_dir

        where = "."
        try:
            path = cache_dir() / "clipboard.txt"
            path.write_text(text, encoding="utf-8")
            where = f"; also in {visible(str(path), newlines=False)}"
        except OSError as exc:
            where = f" (not written to a file: {exc.strerror})"
        self.notify(f"copied {describe.short(event.site, 30)} ({len(text):,} characters) to the clipboard{where}",
                    timeout=6, markup=False)

    def action_export(self) -> None:
        ask_export(self.app, self.view.run_id)

    def action_filter(self) -> None:
        """`f`: which layers and kinds the expanded steps show."""
        from tttr.app.steps import FILTER_HELP, parse_filter

        self.app.push_screen(AskScreen("Filter", FILTER_HELP, parse_filter, str(self.timeline.rows.filter)),
                             self._filtered)

    def _filtered(self, event_filter) -> None:
        if event_filter is not None:
            self.timeline.set_filter(event_filter)
            self.timeline.focus()
            if event_filter.active and not self.timeline.rows.expanded:
                self.notify("the filter applies inside expanded steps: space expands one, z every one",
                            timeout=4, markup=False)

    def action_blame(self) -> None:
        """`b` on a command (its tool result, or a step's row): the step and command that last
        wrote the first file it names (`cat greeting.txt`: who wrote greeting.txt), found in a
        worker; the cursor then goes there."""
        event = self.current
        if event is not None and event.kind not in ("tool", "action") and self.timeline.on_step_row:
            event = self.view.at(site(event.step, "tool")) or event  # a step's row: its command
        value = event.value if event is not None and isinstance(event.value, dict) else {}
        command = value.get("cmd") if event is not None and event.kind in ("tool", "action") else None
        if not isinstance(command, str) or not isinstance(event.step, int):
            self.timeline.nowhere("b works on a command: a tool result, an action or a step's row")
            return
        cwd = value.get("cwd") if isinstance(value.get("cwd"), str) else None
        self.run_worker(partial(self._blame, event.step, command, cwd), thread=True, exclusive=True,
                        group="blame", exit_on_error=False, name="blame")

    def _blame(self, step: int, command: str, cwd: str | None) -> None:
        from tttr.engine.blame import blame_command_input
        from tttr.sessions.store import Store

        try:
            with Store.open(self.app.db_path, create=False, readonly=True) as store:
                found = blame_command_input(store, self.view.run_id, step, command, cwd)
        except Exception as exc:  # noqa: BLE001 - said in a notification
            self.post_message(CommandBlamed(None, str(exc)))
            return
        self.post_message(CommandBlamed(found, None if found is not None else
                                        "the command names no file of the tree before it"))

    def on_command_blamed(self, message: "CommandBlamed") -> None:
        found = message.blame
        if found is None:
            self.timeline.nowhere(f"cannot tell where its input came from: {describe.short(message.error, 160)}")
            return
        self.notify(visible(found.describe(), newlines=False), timeout=6, markup=False)
        if found.seq is not None:
            self.timeline.go_to(found.seq, "this is the command that wrote it")

    def action_token_context(self) -> None:
        """`p` on a token (or its logits): to the step's prompt, the detail pane showing what
        the token was conditioned on: the prompt's end, then the tokens generated before it."""
        event = self.current
        pos = token_pos(event) if event is not None and event.kind in ("token", "logits") else None
        if pos is None or not isinstance(event.step, int):
            self.timeline.nowhere("p works on a token or logits row: it shows the prompt and tokens before it")
            return
        prompt = self.view.at(site(event.step, "prompt"))
        if prompt is None or not isinstance(prompt.seq, int) or prompt.seq < 0:
            self.timeline.nowhere(f"step {event.step} recorded no prompt")
            return
        self.context_at = (event.step, pos)
        self.timeline.cursor = prompt.seq
        self.timeline.focus()

    def action_timing(self) -> None:
        """`t`: each step's tokens and command time, as bars."""
        from tttr.app.screens.timing import TimingScreen

        self.app.push_screen(TimingScreen(self.view.run_id))

    def action_switch_pane(self) -> None:
        detail = self.query_one(DetailPane)
        (self.timeline if detail.has_focus else detail).focus()

    def action_files(self) -> None:
        """The sandbox's files after the step under the cursor, marked against the step before."""
        from tttr.app.screens.files import FilesScreen, TreeRef

        event = self.current
        step = event.step if event is not None and isinstance(event.step, int) else -1
        run = self.view.run_id
        self.app.push_screen(FilesScreen(TreeRef(run, step), TreeRef(run, step - 1) if step >= 0 else None))

    def action_diff_parent(self) -> None:
        from tttr.app.screens.compare import CompareScreen

        self.app.push_screen(CompareScreen(self.view.run.parent, self.view.run_id))

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "cancel_fork":
            return self.fork_cancel is not None
        if action == "diff_parent":
            return self.view.run.parent is not None
        return True

    def action_back(self) -> None:
        self.app.pop_screen()
