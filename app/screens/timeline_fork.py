"""The timeline's edit-and-fork: the edit dialog for the value under the cursor (a clock
reading, a tool result, a token, or a recorded program's SDK value), its validation against
the engine's mutation grammar, and the fork run in a worker with progress, cancel, and the
compare opened when it is done. A mixin of TimelineScreen, which provides `view`, `current`,
`fork_cancel`, `token_texts` and `_show_detail`."""

from __future__ import annotations

import json
import re
import threading
from functools import partial

from tttr.app import describe
from tttr.engine.kinds import kind_of
from tttr.app.forking import ForkFailed, ForkFinished, ForkProgressed, run_fork
from tttr.app.runview import BLOB_PREVIEW, EDITABLE_KINDS, TOO_LARGE, RunView, is_blob, value_problem
from tttr.app.screens.ask import AskScreen
from tttr.app.screens.edit import EditScreen
from tttr.app.widgets.fork_progress import ForkProgress
from tttr.sessions.safe_text import visible
from tttr.sessions.vocabulary import SETUP, SETUP_STEP, Site, site

SETUP_HELP = ("file:PATH a file of the start tree (notes/a.txt; a new one where its folder is) · "
              "env:NAME a variable the commands start with · clock the start clock")


class EditAndFork:
    """`e` edits the value under the cursor and forks the run there; `x` cancels the fork."""

    def action_edit(self) -> None:
        event = self.current
        if event is None:
            return
        problem = value_problem(event)
        if problem is not None:
            self.notify(f"{describe.short(event.site, 40)} is unreadable ({describe.short(problem, 120)}): "
                        "its value cannot be edited, nor the run forked there", severity="error", markup=False)
            return
        offer = kind_of(self.view.run).edit_offer(event)  # a recorded program's; None for the agent's runs
        if isinstance(offer, str):
            self.notify(offer, severity="warning", markup=False)
            return
        if event.kind == "setup" and offer is None:  # the start tree's files, its variables, its clock
            self.edit_setup()
            return
        if event.kind not in EDITABLE_KINDS and offer is None:
            kind = describe.short(event.kind, 20)
            self.notify(
                f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind} event cannot be edited: move to a clock or tool "
                "event (R) or a token (K)",
                severity="warning", markup=False,
            )
            return
        if self.fork_cancel is not None:
            self.notify("a fork is already running: wait for it, or press x to cancel it", severity="warning",
                        markup=False)
            return
        if offer is not None:
            self.app.push_screen(EditScreen(offer.site, offer.kind, offer.current, partial(self.validate_edit, offer.site)),
                                 partial(self.start_fork, offer.site))
            return
        if event.kind == "tool":
            # The dialog starts from the recorded output: it must be all there, as recorded.
            stdout = event.value.get("stdout")
            text = self.view.loaded_text(stdout)
            if text is None:
                self._show_detail(event)  # (re)starts its loading
                self.notify("the recorded output is still loading: press e again in a moment",
                            severity="warning", markup=False)
                return
            if len(text) > BLOB_PREVIEW or is_blob(stdout) and (TOO_LARGE in text or text.startswith("‹blob")):
                self.notify("the recorded output is too large to show in full (or unreadable), so it cannot "
                            "be edited here: fork from the command line with `tttr fork`",
                            severity="error", markup=False)
                return
        alternatives = []
        if event.kind == "token":
            alternatives = describe.alternatives(self.view, event, self.token_texts)
        self.app.push_screen(
            EditScreen(event.site, event.kind, editable_text(self.view, event),
                       partial(self.validate_edit, event.site), alternatives),
            partial(self.start_fork, event.site),
        )

    def edit_setup(self) -> None:
        """`e` on the setup step: which value to change (a file of the start tree, a variable
        the commands start with, the start clock), then the edit dialog for that site."""
        if self.fork_cancel is not None:
            self.notify("a fork is already running: wait for it, or press x to cancel it", severity="warning",
                        markup=False)
            return
        self.app.push_screen(AskScreen("Edit a setup value and fork", SETUP_HELP, self.setup_site, "file:"),
                             self._edit_setup_site)

    def setup_site(self, text: str) -> tuple[str, str, str]:
        """(site, kind, recorded text) of the setup value `text` names (`file:notes/a.txt`,
        `env:GREETING`, `clock`); ValueError saying why when it names none."""
        text = text.strip()
        if text in ("clock", f"{SETUP}:clock"):
            clock = self.view.at(site(SETUP_STEP, "clock"))
            if clock is None or value_problem(clock) is not None:
                raise ValueError("this run recorded no readable start clock")
            return str(Site(SETUP_STEP, "clock")), "clock", editable_text(self.view, clock)
        parsed = Site.parse(text if text.startswith(f"{SETUP}:") else f"{SETUP}:{text}")  # SiteError: a ValueError
        if parsed.arg is None:
            raise ValueError(f"{text!r} names no setup value: {SETUP_HELP}")
        setup = self.view.at(site(SETUP_STEP, "setup"))
        value = setup.value if setup is not None and isinstance(setup.value, dict) else {}
        if parsed.name == "env":
            exports = value.get("exports") if isinstance(value.get("exports"), dict) else {}
            return str(parsed), "env", _json(str(exports.get(parsed.arg, "")))
        return str(parsed), "file", _json(self._start_file_text(parsed.arg))

    def _start_file_text(self, path: str) -> str:
        """The text of `path` in the run's start tree ("" for a file it does not have yet)."""
        from tttr.recorders.treestate import RunTrees, file_text

        start = RunTrees(self.view.store, self.view.run_id).at(SETUP_STEP)
        if start.note is not None:
            raise ValueError(f"the start tree cannot be read: {start.note}")
        found = file_text(self.view.store, start.files.get(path))
        if found.text is None:
            raise ValueError(f"{path} in the start tree is {found.note}: only a text file can be edited here")
        return found.text

    def _edit_setup_site(self, answer: tuple[str, str, str] | None) -> None:
        if answer is None:
            return
        at, kind, current = answer
        self.app.push_screen(EditScreen(at, kind, current, partial(self.validate_edit, at)),
                             partial(self.start_fork, at))

    def validate_edit(self, site: str, text: str) -> str | None:
        """None when `text` is a valid new value for `site`, else why not: the run's kind checks
        it (`kind.check_value`), as its fork will; the whole fork is checked when it starts."""
        run = self.view.run
        if run.status != "complete":
            return f"run #{run.id} is {run.status}: only complete runs can be forked"
        try:
            from tttr.engine.kinds import kind_of

            kind_of(run).check_value(self.view.store, run, site, text, self.app.runtime())
        except ImportError as exc:
            return f"editing needs the engine, which failed to import: {exc}"
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
            result = run_fork(self.app.db_path, parent, site, value, runtime=runtime,  # as the run's kind forks
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
        self.notify(visible(f"fork at {message.site} failed: {message.error}"), severity="error", timeout=10,
                    markup=False)

    def on_fork_finished(self, message: ForkFinished) -> None:
        self._fork_done()
        result = message.result
        if message.cancelled or result.status != "complete":
            self.notify(visible(f"fork cancelled: run #{result.run_id} is stored {result.status}"),
                        severity="warning", markup=False)
            return
        if self.app.screen is not self:
            # The person is elsewhere (a dialog, another screen): say where the fork is rather
            # than push the compare over what they are looking at.
            self.notify(visible(f"fork at {message.site} stored as run #{result.run_id}; "
                                "open it and press d to compare it with its parent"), markup=False, timeout=10)
            return
        self.notify(visible(f"fork at {message.site} stored as run #{result.run_id}"), markup=False)
        from tttr.app.screens.compare import CompareScreen

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


def editable_text(view: RunView, event) -> str:
    """The recorded value as the edit dialog shows it (the syntax parse_mutation takes).
    JSON escapes control characters, so the text is safe to show and edit on one line."""
    value = event.value if isinstance(event.value, dict) else {}
    if event.kind == "clock":
        return visible(str(value.get("t", "")), newlines=False)
    if event.kind in ("token", "message"):
        return _json(str(value.get("text", "")))
    # JSON keeps newlines editable on one line, and is a form parse_mutation takes.
    return _json({"stdout": view.text(value.get("stdout")), "exit_code": value.get("exit_code")})


# What json.dumps(ensure_ascii=False) leaves raw and a terminal would act on: DEL, C1, and
# the formatting characters that reorder text. Escaped as JSON, they stay the same value.
_RAW_CONTROLS = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _json(value) -> str:
    return _RAW_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(value, ensure_ascii=False))
