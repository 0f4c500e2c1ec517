"""The TTTR app: runs → timeline of one run → edit and fork → the fork next to its parent.

The app holds the store (opened read-only by `tttr open`) and what several screens share:
the database path (workers open their own connections from it), a tokenizer to name
top-k alternatives, and the model runtime a fork needs, both loaded lazily off the UI
thread.
"""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path

from textual.app import App
from textual.binding import Binding
from textual.message import Message

from tttr.app.palette import TTTRCommands
from tttr.app.runview import RunView
from tttr.app.screens.help import HelpScreen, screen_keys
from tttr.app.screens.runs import RunsScreen
from tttr.app.screens.timeline import TimelineScreen
from tttr.sessions.safe_text import visible


class TokenizerLoaded(Message):
    def __init__(self, model_id: str, tokenizer) -> None:
        super().__init__()
        self.model_id, self.tokenizer = model_id, tokenizer


class PromptsRebuilt(Message):
    """The prompts of run `run_id` as text ({step: Prompt}), or why not (a line)."""

    def __init__(self, run_id: int, prompts: dict | str) -> None:
        super().__init__()
        self.run_id, self.prompts = run_id, prompts


class TTTRApp(App):
    CSS_PATH = "styles/app.tcss"
    COMMANDS = App.COMMANDS | {TTTRCommands}
    TITLE = "TTTR"
    BINDINGS = [
        Binding("question_mark", "help", "help"),
        Binding("q", "quit", "quit"),
    ]

    def __init__(
        self,
        store,
        *,
        run_id: int | None = None,
        model: str | None = None,
        unsafe_no_sandbox: bool = False,
        load_tokenizer: bool = True,
    ) -> None:
        super().__init__()
        self.store = store
        self.db_path = Path(store.path)
        self.start_run = run_id
        self.model = model
        self.unsafe_no_sandbox = unsafe_no_sandbox
        self._load_tokenizer = load_tokenizer
        self._tokenizers: dict[str | None, object] = {}
        self._runtime = None
        self._runtime_lock = threading.Lock()
        self._prompts: dict[int, dict | str] = {}  # run id -> {step: Prompt}, or why there is none
        self.bookmarks: dict[int, set[int]] = {}  # run id -> bookmarked seqs, for this app session only

    def on_mount(self) -> None:
        self.push_screen(RunsScreen())
        if self.start_run is not None:
            self.open_run(self.start_run)
        if self._load_tokenizer:
            self.run_worker(self._tokenizer_worker, thread=True, exit_on_error=False, name="tokenizer")

    async def action_quit(self) -> None:
        """Quit; while a fork runs, ask first (quitting stops it after its current step,
        and it is kept as an incomplete run)."""
        from tttr.app.screens.confirm import ConfirmScreen
        from tttr.app.widgets.fork_progress import ForkProgress

        if isinstance(self.screen, ConfirmScreen):
            return
        if any(bar.running for screen in self.screen_stack for bar in screen.query(ForkProgress)):
            question = ("A fork is still running. Quit anyway?\nIt stops after its current step and is kept "
                        "as an incomplete run.")
            self.push_screen(ConfirmScreen(question, yes="Quit", no="Keep forking"),
                             lambda yes: self.exit() if yes else None)
            return
        from tttr.app.screens.triage import ExperimentScreen

        if any(isinstance(screen, ExperimentScreen) and screen.cancel is not None for screen in self.screen_stack):
            question = ("A triage or bisect is still running. Quit anyway?\nIts replay in flight stops after its "
                        "current step; the replays it stored are kept.")
            self.push_screen(ConfirmScreen(question, yes="Quit", no="Keep going"),
                             lambda yes: self.exit() if yes else None)
            return
        self.exit()

    # -- navigation -------------------------------------------------------------------
    def open_run(self, run_id: int, step: int | None = None, *, event: int | None = None) -> None:
        try:
            view = RunView(self.store, run_id, defer_blobs=True)
        except Exception as exc:  # noqa: BLE001 - a run the store cannot read is reported, not fatal
            self.notify(f"run #{run_id} cannot be opened: {visible(str(exc))}", severity="error",
                        timeout=10, markup=False)
            return
        start = (view.step_start(step) or 0) if step is not None else 0
        self.push_screen(TimelineScreen(view, start=start, event=event))


    def show_event(self, run_id: int, seq: int | None, *, below=None) -> None:
        """Leave `below` (and the screens above it) for run `run_id`'s timeline at event
        `seq`: the one under it when it shows that run, else the run opened anew."""
        from tttr.app.screens.timeline import TimelineScreen

        stack = self.screen_stack
        if below is not None and below in stack:
            while self.screen is not below:
                self.pop_screen()
            self.pop_screen()
        if isinstance(self.screen, TimelineScreen) and self.screen.view.run_id == run_id:
            if seq is not None:
                self.screen.timeline.go_to(seq, f"already at event {seq}")
        else:
            self.open_run(run_id, event=seq)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            title = type(self.screen).__name__.removesuffix("Screen").lower()
            self.push_screen(HelpScreen(screen_keys(self.screen), f"{title} keys"))

    # -- what forks and the detail pane need ------------------------------------------
    def runtime(self):
        """The model runtime forks run on: created once (resolving the model path is
        cheap; the weights load on the first position a fork computes). Thread-safe."""
        with self._runtime_lock:
            if self._runtime is None:
                from tttr.engine.replay.runtime import Runtime

                self._runtime = Runtime(self.model, kernel_mode="invariant")
            return self._runtime

    def tokenizer_for(self, model_id: str | None):
        """The tokenizer of `model_id` if it is the model this app forks with, else None."""
        try:
            runtime = self.runtime()
            if runtime.model_id != model_id:
                return None
            return runtime.tokenizer
        except Exception:  # noqa: BLE001 - no model here: alternatives show ids only
            return None

    def token_texts(self, ids: list[int], model_id: str | None) -> dict[int, str]:
        tokenizer = self._tokenizers.get(model_id)
        if tokenizer is None:
            return {}
        out = {}
        for i in ids:
            try:
                out[i] = tokenizer.decode([i])
            except Exception:  # noqa: BLE001 - an id the tokenizer does not know stays unnamed
                pass
        return out

    def _tokenizer_worker(self) -> None:
        """Off the UI thread: load the tokenizer of each model in the database that is
        the model at hand, so top-k alternatives read as text."""
        for model_id in self.store.model_ids():
            tokenizer = self.tokenizer_for(model_id)
            if tokenizer is not None:
                # Posted, not called: a call from this thread would wait forever on an app that quit.
                self.post_message(TokenizerLoaded(model_id, tokenizer))

    def on_tokenizer_loaded(self, message: TokenizerLoaded) -> None:
        self._tokenizers[message.model_id] = message.tokenizer
        if isinstance(self.screen, TimelineScreen):
            self.screen.refresh_token_texts()

    def forget_run(self, run_id: int) -> None:
        """Drop what this app session keeps by run id (bookmarks, rebuilt prompts): a deleted
        run's id can be given again to the next run the file stores."""
        self.bookmarks.pop(run_id, None)
        self._prompts.pop(run_id, None)

    # -- the prompts a run's model read, as text ------------------------------------------
    def prompt_of(self, run, step: int):
        """The prompt of `run` at `step` as rebuilt from the record (a Prompt), or a line
        saying why it is not shown. The first ask starts the rebuild in a worker (the
        tokenizer takes a moment to load); `PromptsRebuilt` then reaches the screen."""
        found = self._prompts.get(run.id)
        if found is None:
            if not self._load_tokenizer:
                return "the prompt's text is not rebuilt: the app was started without a tokenizer"
            self._prompts[run.id] = found = "rebuilding the prompt's text from the record …"
            self.run_worker(partial(self._prompts_worker, run), thread=True, exit_on_error=False,
                            name=f"prompts of run {run.id}")
        if isinstance(found, str):
            return found
        return found.get(step, f"no prompt of step {step} could be rebuilt")

    def prompt_tokenizer(self, run):
        """The tokenizer of the model `run` was recorded with: the model at hand if it is
        that one, else the model file the run's fingerprint names, if it is still there."""
        tokenizer = self.tokenizer_for(run.model_id)
        if tokenizer is not None:
            return tokenizer
        fingerprint = run.fingerprint if isinstance(run.fingerprint, dict) else {}
        path = fingerprint.get("model_path")
        if not isinstance(path, str) or not Path(path).is_file():
            raise LookupError(f"the model the run was recorded with ({run.model_id}) is not here: "
                              "start the app with --model pointing at it")
        from tttr.engine.replay.runtime import Runtime

        return Runtime(path).tokenizer

    def _prompts_worker(self, run) -> None:
        """Off the UI thread, on a connection of its own: every prompt of the run, rebuilt."""
        from tttr.engine.replay.prompts import prompts
        from tttr.sessions.store import Store

        try:
            tokenizer = self.prompt_tokenizer(run)
            store = Store.open(self.db_path, create=False, readonly=True)
            try:
                found: dict | str = {p.step: p for p in prompts(store, run.id, tokenizer)}
            finally:
                store.close()
        except Exception as exc:  # noqa: BLE001 - shown in the pane where the text would be
            found = f"the prompt's text cannot be rebuilt: {exc}"
        # Posted, not called: a call from this thread would wait forever on an app that quit.
        self.post_message(PromptsRebuilt(run.id, found))

    def prompts_for_search(self, store, run) -> dict | None:
        """{step: Prompt} of `run` for the search index (called in its worker thread): the
        ones already rebuilt, else rebuilt now through `store` (a connection of that
        thread); None when the app has no tokenizer for them (prompts are then indexed by
        what their events hold)."""
        found = self._prompts.get(run.id)
        if isinstance(found, dict) or not self._load_tokenizer:
            return found if isinstance(found, dict) else None
        from tttr.engine.replay.prompts import prompts

        try:
            return {p.step: p for p in prompts(store, run.id, self.prompt_tokenizer(run))}
        except Exception:  # noqa: BLE001 - no tokenizer or no prompt to rebuild: index without them
            return None

    def on_prompts_rebuilt(self, message: PromptsRebuilt) -> None:
        self._prompts[message.run_id] = message.prompts
        if isinstance(self.screen, TimelineScreen) and self.screen.view.run_id == message.run_id:
            self.screen.refresh_detail()
