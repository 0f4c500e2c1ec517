"""Triage and bisect from the app: two marked runs (GOOD and BAD), the experiment run in a
worker on a store connection of its own, its progress line by line, the verdict, and the
replays it stored, each openable on its timeline or beside the run it replayed.

The work is the pair's kind's (`kind.check_experiment`, then `kind.triage` / `kind.bisect`),
asked as `tttr triage` / `tttr bisect` ask it; a refusal (runs of another kind or of different
tasks, no difference, a GOOD that fails its own check) is shown as its one line and nothing
else."""

from __future__ import annotations

import threading
from functools import partial
from typing import NamedTuple

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, LoadingIndicator, Static

from tttr.app.screens.footer import FittedFooter
from tttr.app.screens.help import label_back
from tttr.engine.replay.deltas import counted
from tttr.sessions.safe_text import visible

KINDS = ("triage", "bisect")
MAX_REPLAYS = 50  # bisect's budget, as `tttr bisect` defaults it


class Tested(NamedTuple):
    """One replay the experiment stored: run `run_id`, a replay of run `replayed`."""

    run_id: int
    replayed: int
    what: str  # the deltas applied
    outcome: str  # the checker's verdict, or the run's status
    judged: str  # what the experiment read from it


class ExperimentProgressed(Message):
    def __init__(self, line: str) -> None:
        super().__init__()
        self.line = line


class ExperimentFinished(Message):
    """The verdict (lines) and the replays; `cancelled`: stopped early, the best so far."""

    def __init__(self, verdict: list[str], tested: list[Tested], cancelled: bool) -> None:
        super().__init__()
        self.verdict, self.tested, self.cancelled = verdict, tested, cancelled


class ExperimentFailed(Message):
    """Refused or failed: one line."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


def _passed(run) -> bool:
    return run.outcome is not None and run.outcome.passed is True


def good_and_bad(first, second) -> tuple[int, int, str]:
    """(GOOD, BAD, judge) of two marked runs: the one that passed is GOOD and the checker
    judges; when neither or both passed, the first marked is GOOD and the actions are compared."""
    if _passed(first) != _passed(second):
        good, bad = (first, second) if _passed(first) else (second, first)
        return good.id, bad.id, "outcome"
    return first.id, second.id, "actions"


def _outcome(trial) -> str:
    if trial.passed is True:
        return "passed"
    if trial.passed is False:
        return "failed"
    return str(trial.extra.get("status", "no outcome"))


def _sites(deltas, shown: int = 4) -> str:
    return ", ".join(d.site for d in deltas[:shown]) + (" …" if len(deltas) > shown else "")


class ExperimentScreen(FittedFooter, Screen):
    CSS_PATH = "../styles/experiments.tcss"
    BINDINGS = [
        Binding("enter", "open", "open replay"),
        Binding("c", "compare", "compare with the run it replayed"),
        Binding("C", "compare_other", "compare with the other run"),
        Binding("x", "cancel", "cancel"),
        Binding("escape", "back", "back"),
    ]
    place = "experiment"

    def __init__(self, kind: str, good: int, bad: int, judge: str = "outcome") -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown experiment {kind!r}: use triage or bisect")
        super().__init__()
        self.kind, self.good, self.bad, self.judge = kind, good, bad, judge
        self.cancel: threading.Event | None = None
        self.lines: list[str] = []  # the progress, as shown
        self.verdict: list[str] = []
        self.error: str | None = None
        self.tested: list[Tested] = []

    def compose(self) -> ComposeResult:
        title = Text(f"{self.kind}: GOOD run #{self.good}, BAD run #{self.bad}", style="bold")
        title.append(f"  · judge: {self.judge}", style="dim")
        yield Static(title, id="experiment-title")
        yield LoadingIndicator(id="experiment-loading")
        yield Static("", id="experiment-progress")
        yield Static("", id="experiment-verdict")
        yield DataTable(id="experiment-replays", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        label_back(self)
        table = self.query_one(DataTable)
        for column in ("run", "replay of", "applied", "checker", self.kind):
            table.add_column(column, key=column)
        table.display = False
        self.cancel = cancel = threading.Event()
        self.refresh_bindings()
        self.run_worker(partial(self._work, cancel), thread=True, exit_on_error=False, name=self.kind)

    # -- the worker ------------------------------------------------------------------------
    def _say(self, line: str) -> None:
        self.post_message(ExperimentProgressed(line))

    def _work(self, cancel: threading.Event) -> None:
        """In a worker thread: the pair's kind checks the experiment on a read-only connection of
        its own (a refusal writes nothing), then runs it on a writable one (the app's is read-only)."""
        from tttr.engine.kinds import ExperimentRequest, pair_kind
        from tttr.sessions.store import Store

        try:
            db = str(self.app.db_path)
            with Store.open(db, create=False, readonly=True) as reader:
                # Two runs of one kind that experiments take (else its refusal, before any model).
                kind = pair_kind(reader.run(self.good), reader.run(self.bad), self.kind)
                self._say("loading the model …")  # its weights load only when a replay computes
                request = ExperimentRequest(self.good, self.bad, judge=self.judge, model=self.app.model,
                                            max_replays=MAX_REPLAYS, unsafe_no_sandbox=self.app.unsafe_no_sandbox,
                                            runtime=self.app.runtime())
                plan = kind.check_experiment(reader, db, self.kind, request)
            run = self._triage if self.kind == "triage" else self._bisect
            verdict, tested = run(kind, db, plan, cancel)
        except _Cancelled as stop:
            self.post_message(ExperimentFinished(stop.verdict, stop.tested, True))
            return
        except Exception as exc:  # noqa: BLE001 - the refusal or failure is the line to show
            known = getattr(exc, "exit_code", None) is not None or isinstance(exc, ValueError)
            self.post_message(ExperimentFailed(str(exc) if known else f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(ExperimentFinished(verdict, tested, cancel.is_set()))

    def _triage(self, kind, db: str, plan, cancel):
        from tttr.sessions.vocabulary import RECORDED_LAYERS

        # The replays may run side by side and finish in any order: the progress lines come as
        # they finish, each naming its layer; the table lists them in the layers' order.
        rows: dict[str, Tested] = {}
        tested: list[Tested] = []

        def on_layer(r) -> None:
            if r.trial is None:
                self._say(f"{r.layer}: no differences, not replayed")
            else:
                fixed = {True: "the failure disappears", False: "still fails", None: "stopped: no verdict"}[r.fixed]
                self._say(f"{r.layer}: {len(r.deltas)} delta(s) from GOOD → run {r.trial.run_id} "
                          f"({_outcome(r.trial)}): {fixed}")
                rows[r.layer] = Tested(r.trial.run_id, self.bad, f"GOOD's {r.layer}: {_sites(r.deltas)}",
                                       _outcome(r.trial), {True: "fixed", False: "still fails", None: "stopped"}[r.fixed])
                tested[:] = [rows[layer] for layer in RECORDED_LAYERS if layer in rows]
            if cancel.is_set():
                # The replays in flight stop at their next step (each still reported here, into
                # `tested`); no other layer starts.
                raise _Cancelled(["cancelled: a layer whose replay did not finish is unknown"], tested)

        self._say(f"replaying BAD run {self.bad} with each layer taken from GOOD run {self.good} …")
        res = kind.triage(db, plan, on_layer=on_layer, cancel=cancel)
        return [f"verdict: {res.verdict()}", f"replays: {len(tested)} ({res.batch_note})"], tested

    def _bisect(self, kind, db: str, plan, cancel):
        tested: list[Tested] = []

        def on_round(rnd, n, current, tests) -> None:
            self._say(f"round {rnd}: {counted(len(current))} in {min(n, len(current))} parts, "
                      f"{tests + 1} replays so far")

        def on_trial(trial) -> None:
            judged = "fails" if trial.failed else "does not fail"
            self._say(f"tested {len(trial.deltas)} delta(s) → run {trial.run_id} ({_outcome(trial)}): {judged}")
            tested.append(Tested(trial.run_id, self.good, f"BAD's {_sites(trial.deltas)}", _outcome(trial), judged))
            if cancel.is_set():
                # ddmin's interrupt: it ends with the best set so far (a cancelled test is not a verdict)
                raise KeyboardInterrupt

        self._say(f"replaying GOOD run {self.good} with subsets of BAD run {self.bad}'s differences …")
        try:
            res = kind.bisect(db, plan, on_round=on_round, on_trial=on_trial, cancel=cancel)
        except KeyboardInterrupt:  # cancelled while the whole set was tested: no set yet
            raise _Cancelled(["cancelled before the first test finished: no set found"], tested) from None
        r = res.result
        head = {None: "minimal failure-inducing set", "budget": f"best set so far ({MAX_REPLAYS} replays reached)",
                "interrupted": "best set so far (cancelled)"}[r.stopped]
        verdict = [f"{head}: {len(r.items)} delta(s), layer(s) {', '.join(sorted({d.layer for d in r.items}))}"]
        verdict += [f"  {d.describe()}" for d in r.items]
        verdict.append(f"replays used: {res.replays} ({res.batch_note})")
        return verdict, tested

    # -- what the worker reports ------------------------------------------------------------
    def on_experiment_progressed(self, message: ExperimentProgressed) -> None:
        self.lines.append(visible(message.line, newlines=False))  # sites and values come from the file
        self.query_one("#experiment-progress", Static).update(Text("\n".join(self.lines[-12:]), style="dim"))

    def on_experiment_failed(self, message: ExperimentFailed) -> None:
        self._done()
        self.error = visible(message.error, newlines=False)
        self.query_one("#experiment-progress", Static).display = False
        self.query_one("#experiment-verdict", Static).update(Text(f"{self.kind}: {self.error}", style="bold red"))

    def on_experiment_finished(self, message: ExperimentFinished) -> None:
        self._done()
        self.verdict = [visible(line, newlines=False) for line in message.verdict]
        self.tested = message.tested
        text = Text("\n".join(self.verdict), style="bold yellow" if message.cancelled else "bold")
        self.query_one("#experiment-verdict", Static).update(text)
        table = self.query_one(DataTable)
        for t in self.tested:
            table.add_row(Text(f"#{t.run_id}", style="bold"), Text(f"#{t.replayed}"),
                          Text(visible(t.what, newlines=False)), Text(visible(t.outcome, newlines=False)),
                          Text(t.judged), key=str(t.run_id))
        table.display = bool(self.tested)
        if self.tested:
            table.focus()

    def _done(self) -> None:
        self.cancel = None
        self.query_one("#experiment-loading").display = False
        self.refresh_bindings()

    # -- keys ------------------------------------------------------------------------------
    def _current(self) -> Tested | None:
        table = self.query_one(DataTable)
        if not table.row_count or not table.display:
            return None
        return self.tested[table.cursor_row]

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_open()

    def action_open(self) -> None:
        t = self._current()
        if t is not None:
            self.app.open_run(t.run_id)

    def _compare(self, pick) -> None:
        """The replay under the cursor beside run `pick(replay)`."""
        from tttr.app.screens.compare import CompareScreen

        t = self._current()
        if t is not None:
            self.app.push_screen(CompareScreen(pick(t), t.run_id))

    def action_compare(self) -> None:
        self._compare(lambda t: t.replayed)

    def action_compare_other(self) -> None:
        self._compare(lambda t: self.good if t.replayed == self.bad else self.bad)

    def action_cancel(self) -> None:
        if self.cancel is not None:
            self.cancel.set()
            self.query_one("#experiment-loading").display = False
            self.on_experiment_progressed(ExperimentProgressed("cancelling: the replay in flight stops after its step …"))

    def check_action(self, action: str, parameters) -> bool | None:
        if action == "cancel":
            return self.cancel is not None
        if action in ("open", "compare", "compare_other"):
            return bool(self.tested)
        return True

    def on_unmount(self) -> None:
        # Leaving the screen stops the experiment at its next step; its replays stay stored.
        if self.cancel is not None:
            self.cancel.set()

    def action_back(self) -> None:
        self.app.pop_screen()


class _Cancelled(Exception):
    """The user cancelled: what was found so far."""

    def __init__(self, verdict: list[str], tested: list[Tested]) -> None:
        super().__init__("cancelled")
        self.verdict, self.tested = verdict, tested
