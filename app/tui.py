"""The TTTR app: runs → timeline of one run → edit and fork → the fork next to its parent.

The app holds the store (opened read-only by `tttr open`) and what several screens share:
the database path (workers open their own connections from it), a tokenizer to name
top-k alternatives, and the model runtime a fork needs, both loaded lazily off the UI
thread.
"""

from __future__ import annotations

import threading
from pathlib import Path

from textual.app import App
from textual.binding import Binding

from app.runview import RunView
from app.screens.help import HelpScreen, key_label
from app.screens.runs import RunsScreen
from app.screens.timeline import TimelineScreen


class TTTRApp(App):
    CSS_PATH = "styles/app.tcss"
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
        self.tokenizer = None
        self._load_tokenizer = load_tokenizer
        self._runtimes: dict[str, object] = {}
        self._runtime_lock = threading.Lock()

    def on_mount(self) -> None:
        self.push_screen(RunsScreen())
        if self.start_run is not None:
            self.open_run(self.start_run)
        if self._load_tokenizer:
            self.run_worker(self._tokenizer_worker, thread=True, exit_on_error=False, name="tokenizer")

    # -- navigation -------------------------------------------------------------------
    def open_run(self, run_id: int, step: int | None = None) -> None:
        view = RunView(self.store, run_id)
        start = (view.step_start(step) or 0) if step is not None else 0
        self.push_screen(TimelineScreen(view, start=start))


    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            title = type(self.screen).__name__.removesuffix("Screen").lower()
            self.push_screen(HelpScreen(self._own_bindings(), f"{title} keys"))

    def _own_bindings(self) -> list[tuple[str, str]]:
        """The keys TTTR defines for what is on screen (focused widget, then its screen,
        then the app), in the order they are declared; Textual's own are left out."""
        nodes = []
        node = self.focused
        while node is not None and node is not self.screen:
            nodes.append(node)
            node = node.parent
        nodes += [self.screen, self]
        out: list[tuple[str, str]] = []
        for node in nodes:
            for cls in reversed(type(node).__mro__):
                if not cls.__module__.startswith("app.") or "BINDINGS" not in cls.__dict__:
                    continue
                for binding in cls.__dict__["BINDINGS"]:
                    action = binding.action.split("(")[0]
                    if node.check_action(action, ()) is False:
                        continue
                    out.append((key_label(binding.key), binding.description or action))
        return out

    # -- what forks and the detail pane need ------------------------------------------------
    def token_texts(self, ids: list[int]) -> dict[int, str]:
        if self.tokenizer is None:
            return {}
        out = {}
        for i in ids:
            try:
                out[i] = self.tokenizer.decode([i])
            except Exception:  # noqa: BLE001 - an id the tokenizer does not know stays unnamed
                pass
        return out

    def _tokenizer_worker(self) -> None:
        try:
            from engine.tokenizer import load_default_tokenizer

            tokenizer = load_default_tokenizer() if self.model is None else None
        except Exception:  # noqa: BLE001 - without it, alternatives show ids only
            return
        if tokenizer is not None:
            self.call_from_thread(self._tokenizer_ready, tokenizer)

    def _tokenizer_ready(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        if isinstance(self.screen, TimelineScreen):
            self.screen.refresh_token_texts()

    def runtime(self, kernel_mode: str):
        """The model runtime for forks (loaded once, in the calling worker thread)."""
        with self._runtime_lock:
            runtime = self._runtimes.get(kernel_mode)
            if runtime is None:
                from engine.runtime import Runtime

                runtime = self._runtimes[kernel_mode] = Runtime(self.model, kernel_mode=kernel_mode)
            if self.tokenizer is None:
                self.tokenizer = getattr(runtime, "tokenizer", None)
            return runtime
