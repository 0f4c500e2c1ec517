"""The runs screen: every run of the database, forks as a tree under their parent; open
one, mark two and compare them, name or delete a run. It follows the file: a run still
being recorded grows on screen, and runs another process adds or finishes appear.

The table holds a window of the list at a time (`RunsListing`): the first when the screen
shows, the next whenever the cursor or the scroll comes within a screen of its last row."""

from __future__ import annotations

from functools import partial

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tttr.app import describe
from tttr.app.runs_listing import PAGE, RunsListing, is_replay
from tttr.app.screens.confirm import ConfirmScreen
from tttr.app.screens.footer import FittedFooter
from tttr.sessions.safe_text import visible

LINEAGE_WIDTH = 72  # a fork's long new value or a row's problem is cut here (its timeline's title has it
#                    whole), so the columns after it stay on a 140-column screen


def _lineage(run, verdict: str | None) -> Text:
    """The lineage cell: what is wrong with the run's row if anything, else where it comes from."""
    text = describe.run_problem(run) or Text(describe.lineage(run, verdict))
    text.truncate(LINEAGE_WIDTH, overflow="ellipsis")
    return text


class VerdictsRead(Message):
    """Replays' verdicts, read in a worker: {run id: `identical` or `diverged at SITE`}."""

    def __init__(self, verdicts: dict[int, str]) -> None:
        super().__init__()
        self.verdicts = verdicts


COLUMNS = ("", "run", "task", "outcome", "status", "lineage", "steps", "seed", "model", "kernels")  # what matters first: at 80 columns the rest is off to the right
POLL_S = 0.5  # how often the screen asks the file whether anything was committed (one PRAGMA)
LIVE_POLLS = 4  # while a run reads "recording", list again every this many polls (its writer may die)


class RunsScreen(FittedFooter, Screen):
    BINDINGS = [
        Binding("enter", "open", "open", priority=False),
        Binding("space", "mark", "mark for diff"),
        Binding("d", "diff", "diff"),
        Binding("T", "experiment('triage')", "triage the marked pair", show=False),
        Binding("B", "experiment('bisect')", "bisect the marked pair", show=False),
        Binding("S", "stats", "suite stats", show=False),
        Binding("n", "rename", "name run"),
        Binding("delete,x", "delete", "delete run"),
        Binding("r", "reload", "reload"),
        # the timeline's keys move the row here too (the table's own home/end scroll sideways)
        Binding("j", "row(1)", "next run", show=False, priority=True),
        Binding("k", "row(-1)", "previous run", show=False, priority=True),
        Binding("home,g", "first_row", "first run", show=False, priority=True),
        Binding("end,G", "last_row", "last run", show=False, priority=True),
    ]
    place = "runs"  # what a screen above says `escape` goes back to

    def __init__(self) -> None:
        super().__init__()
        self.marked: list[int] = []
        self.seen_version: int | None = None  # the file's data_version when last listed
        self.live = False  # some run reads "recording"
        self.polls = 0
        self.listing: RunsListing | None = None
        self.loaded = 0  # rows of `listing.order` in the table: order[:loaded]
        self.problem: str | None = None  # why the runs cannot be listed, if they cannot
        self.fresh = False
        self.verdicts: dict[int, str] = {}  # replay id -> identical / diverged at SITE, checked in a worker

    def compose(self) -> ComposeResult:
        yield Static("", id="runs-title")
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for column in COLUMNS:
            table.add_column(column, key=column or "mark")
        self.action_reload()
        self.fresh = True  # listed just now: showing the screen for the first time need not list again
        table.focus()
        self.watch(table, "scroll_y", lambda: self._load_near(table.scroll_y + table.size.height), init=False)
        self.set_interval(POLL_S, self.poll)

    def on_screen_resume(self) -> None:
        if not self.fresh:
            self.action_reload()
        self.fresh = False

    def on_screen_suspend(self) -> None:
        self.fresh = False  # a screen above may change the file: coming back lists afresh

    def poll(self) -> None:
        """List the runs again when another connection committed (a recorder's step, a
        fork, a rename), and now and then while a run is live, like `tail -f`."""
        if not self.is_current:
            return  # a screen above shows something else; resuming lists afresh
        self.polls += 1
        try:
            changed = self.app.store.data_version() != self.seen_version
        except Exception:  # noqa: BLE001 - the file went away: the next reload says so
            changed = True
        if changed or (self.live and self.polls % LIVE_POLLS == 0):
            self.action_reload()

    def action_reload(self) -> None:
        """Read every run's place in the tree again, and the rows down to the cursor's (a
        window at least); the cursor stays on its run."""
        store = self.app.store
        table = self.query_one(DataTable)
        current, row = self._current(), table.cursor_row
        table.clear()
        self.loaded = 0
        if self.listing is None or self.listing.store is not store:
            self.listing = RunsListing(store)
        listing = self.listing
        try:
            self.seen_version = store.data_version()
            listing.read()
            at = listing.position.get(current, row) if current is not None else 0
            self._read_rows(max(PAGE, at + PAGE))
        except Exception as exc:  # noqa: BLE001 - a database whose runs do not read is reported
            self.problem = f"cannot list the runs: {describe.short(exc, 200)}"
            self.live = False
            self._show_title()
            return
        self.problem = None
        self.marked = [m for m in self.marked if m in listing.position]
        if table.row_count:
            row = table.get_row_index(str(current)) if str(current) in table.rows else min(row, table.row_count - 1)
            table.move_cursor(row=row, scroll=False)
        self.live = bool(listing.recording)
        self._show_title()

    def _read_rows(self, stop: int) -> None:
        """Read the rows after those in the table, down to `order[stop]`, into it."""
        table = self.query_one(DataTable)
        replays = []
        for listed in self.listing.rows(self.loaded, stop):
            table.add_row(*self._cells(listed.row, listed.prefix), key=str(listed.row.run.id))
            run = listed.row.run
            if is_replay(run) and run.status != "recording" and run.id not in self.verdicts:
                replays.append(run)
        self.loaded = min(stop, len(self.listing))
        if replays:
            self.run_worker(partial(self._check_replays, replays), thread=True, exit_on_error=False,
                            name="replay verdicts", group="verdicts")

    def _check_replays(self, runs: list) -> None:
        """In a worker, on a connection of its own: whether each replay reproduced its parent."""
        from tttr.app.runs_listing import replay_verdict
        from tttr.sessions.store import Store

        try:
            store = Store.open(self.app.db_path, create=False, readonly=True)
        except Exception:  # noqa: BLE001 - the rows keep saying how they were replayed, without a verdict
            return
        try:
            verdicts = {run.id: replay_verdict(store, run) for run in runs}
        finally:
            store.close()
        # Posted, not called: a call from this thread would wait forever on an app that quit.
        self.post_message(VerdictsRead(verdicts))

    def on_verdicts_read(self, message: "VerdictsRead") -> None:
        self.verdicts.update(message.verdicts)
        table = self.query_one(DataTable)
        for run_id, verdict in message.verdicts.items():
            key = str(run_id)
            if key in table.rows:
                try:
                    run = self.app.store.run(run_id)
                except Exception:  # noqa: BLE001 - deleted meanwhile: the next listing drops its row
                    continue
                table.update_cell(key, "lineage", _lineage(run, verdict))

    def _load_near(self, row: int) -> None:
        """Read the next window into the table when `row` is within a screen of its last row."""
        listing = self.listing
        if listing is None or self.problem or self.loaded >= len(listing):
            return
        if row + max(self.query_one(DataTable).size.height, 10) < self.loaded:
            return
        try:
            self._read_rows(self.loaded + PAGE)
        except Exception as exc:  # noqa: BLE001 - the rows above stay; the title says why there are no more
            self.problem = f"cannot list more runs: {describe.short(exc, 200)}"
        self._show_title()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._load_near(event.cursor_row)

    def _show_title(self) -> None:
        title = Text(visible(self.app.db_path.name, newlines=False), style="bold")
        listing = self.listing
        if listing is not None and (self.problem is None or self.loaded):
            title.append(f"  · {len(listing)} runs", style="dim")
            if self.loaded < len(listing):
                title.append(f" ({self.loaded:,} listed, more as you scroll)", style="dim")
        if self.problem:
            title.append(f"  · {self.problem}", style="bold red")
            self.query_one("#runs-title", Static).update(title)
            return
        if listing is not None and listing.recording:
            title.append(f"  · recording: {', '.join(f'#{r}' for r in listing.recording)}", style="cyan")
        if self.marked:
            title.append(f"  · marked for diff: {', '.join(f'#{m}' for m in self.marked)}", style="magenta")
        self.query_one("#runs-title", Static).update(title)

    def _cells(self, row, prefix: str = "") -> list[Text]:
        """One row of the table. Every cell is Text: a DataTable reads a str cell as markup,
        and recorded text is never markup."""
        run = row.run
        label = Text(prefix, style="dim")
        label.append(f"#{run.id}", style="bold")
        if run.name:
            label.append(" " + describe.short(run.name, 40), style="italic")
        lineage = {a.id: a for a in row.ancestors}
        return [
            self._mark(run.id),
            label,
            Text(describe.short(describe.task_label(run, lineage), 40)),  # a recorded program: its command line
            describe.outcome_label(run),
            describe.status_label(run),
            _lineage(run, self.verdicts.get(run.id)),
            Text(str(row.steps)),
            Text(describe.short(run.seed, 20)),
            Text(describe.short(run.model_id or "", 28)),
            Text(describe.short(run.kernel_mode or "", 12)),
        ]

    def _mark(self, run_id: int) -> Text:
        return Text("●" if run_id in self.marked else "", style="bold magenta")

    def _current(self) -> int | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return int(key.value)

    def action_row(self, delta: int) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            table.move_cursor(row=max(0, min(table.cursor_row + delta, table.row_count - 1)))

    def action_first_row(self) -> None:
        table = self.query_one(DataTable)
        if table.row_count:
            table.move_cursor(row=0)

    def action_last_row(self) -> None:
        """The last run of the list: the rows not read yet are read first (by window, as scrolling does)."""
        listing = self.listing
        if listing is not None and not self.problem:
            try:
                while self.loaded < len(listing):
                    self._read_rows(self.loaded + PAGE)
            except Exception as exc:  # noqa: BLE001 - the rows above stay; the title says why there are no more
                self.problem = f"cannot list more runs: {describe.short(exc, 200)}"
            self._show_title()
        table = self.query_one(DataTable)
        if table.row_count:
            table.move_cursor(row=table.row_count - 1)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.app.open_run(int(event.row_key.value))

    def action_open(self) -> None:
        run_id = self._current()
        if run_id is not None:
            self.app.open_run(run_id)

    def action_mark(self) -> None:
        run_id = self._current()
        if run_id is None:
            return
        before = set(self.marked)
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked = (self.marked + [run_id])[-2:]
        table = self.query_one(DataTable)
        for changed in before.symmetric_difference(self.marked):
            if str(changed) in table.rows:
                table.update_cell(str(changed), "mark", self._mark(changed), update_width=True)
        self._show_title()

    def action_diff(self) -> None:
        """Compare the two marked runs; with one marked, it and the run under the cursor;
        with none, the run under the cursor and its parent."""
        current = self._current()
        pair = list(self.marked)
        if len(pair) < 2 and current is not None and current not in pair:
            pair.append(current)
        if len(pair) == 1 and current is not None:
            try:
                parent = self.app.store.run(current).parent
            except Exception:  # noqa: BLE001 - no parent to compare with
                parent = None
            if isinstance(parent, int):
                pair = [parent, current]
        if len(pair) != 2:
            self.notify("mark two runs with space (or stand on a fork) to compare them", severity="warning",
                        markup=False)
            return
        from tttr.app.screens.compare import CompareScreen

        self.app.push_screen(CompareScreen(pair[0], pair[1]))

    # -- experiments: triage or bisect a marked pair, a suite's statistics -------------------
    def action_experiment(self, kind: str) -> None:
        """Triage or bisect the two marked runs (or the one marked and the run under the
        cursor): the one that passed is GOOD, else the first marked."""
        current = self._current()
        pair = list(self.marked)
        if len(pair) == 1 and current is not None and current not in pair:
            pair.append(current)
        if len(pair) != 2:
            self.notify(f"mark two runs of one task with space (GOOD and BAD) to {kind} them", severity="warning",
                        markup=False)
            return
        from tttr.app.screens.triage import ExperimentScreen, good_and_bad

        try:
            good, bad, judge = good_and_bad(*(self.app.store.run(r) for r in pair))
        except Exception as exc:  # noqa: BLE001 - the store's reason is the message to show
            self.notify(visible(f"cannot {kind}: {exc}", newlines=False), severity="error", markup=False)
            return
        self.app.push_screen(ExperimentScreen(kind, good, bad, judge))

    def action_stats(self) -> None:
        from tttr.engine.replay.suite import suite_ids

        try:
            ids = suite_ids(self.app.store)
        except Exception as exc:  # noqa: BLE001 - the store's reason is the message to show
            self.notify(visible(f"cannot read the suites: {exc}", newlines=False), severity="error", markup=False)
            return
        if not ids:
            self.notify("this database holds no suite runs: record some with "
                        f"`tttr suite --runs N --db {visible(str(self.app.db_path), newlines=False)}`",
                        severity="warning", timeout=8, markup=False)
            return
        from tttr.app.screens.stats import StatsScreen

        self.app.push_screen(StatsScreen(ids))

    # -- naming and deleting: through a writable connection of their own -------------------
    def _write(self, what: str, change) -> bool:
        """Apply `change(store)` on a writable connection to the file, closed at once (its
        close checkpoints, so the .db file alone holds the change), then list again."""
        from tttr.sessions.store import Store

        from tttr.sessions.schema import SCHEMA_VERSION

        try:
            with Store.open(self.app.db_path, create=False) as store:
                change(store)
            reader = self.app.store
            if reader.readonly and reader.file_version < SCHEMA_VERSION:
                # The app read an older file through a private copy migrated in memory, which
                # cannot see this write; the writer has migrated the file itself: read it now.
                self.app.store = Store.open(self.app.db_path, create=False, readonly=True)
                reader.close()
        except Exception as exc:  # noqa: BLE001 - the store's reason is the message to show
            self.notify(visible(f"cannot {what}: {exc}", newlines=False), severity="error", timeout=10,
                        markup=False)
            return False
        self.action_reload()
        return True

    def action_rename(self) -> None:
        run_id = self._current()
        if run_id is None:
            return
        from tttr.app.screens.ask import AskScreen
        from tttr.sessions.store import run_name

        try:
            current = self.app.store.run(run_id).name or ""
        except Exception:  # noqa: BLE001 - a run that does not read can still be named
            current = ""
        hint = "1-80 printable characters, shown beside the run's number; enter names it, escape leaves it"
        self.app.push_screen(AskScreen(f"Name run #{run_id}", hint, run_name, value=current),
                             lambda name: self._renamed(run_id, name))

    def _renamed(self, run_id: int, name: str | None) -> None:
        if name is not None and self._write(f"name run #{run_id}", lambda store: store.rename_run(run_id, name)):
            self.notify(visible(f"run #{run_id} is now named {name!r}", newlines=False), markup=False)

    def action_delete(self) -> None:
        run_id = self._current()
        if run_id is None:
            return
        store = self.app.store
        try:
            run = store.run(run_id)
            kids = store.children(run_id)
            own = store.own_events(run_id)
        except Exception as exc:  # noqa: BLE001 - the store's reason is the message to show
            self.notify(visible(f"cannot delete run #{run_id}: {exc}", newlines=False), severity="error",
                        markup=False)
            return
        if kids:
            shown = ", ".join(f"#{k}" for k in kids[:6]) + (" …" if len(kids) > 6 else "")
            self.notify(f"run #{run_id} has {len(kids)} fork(s) or replay(s) that read its events ({shown}): "
                        "delete them first", severity="warning", timeout=8, markup=False)
            return
        if run.status == "recording":
            self.notify(f"run #{run_id} is still being recorded: delete it once it has finished",
                        severity="warning", markup=False)
            return
        question = Text(f"Delete run #{run_id}", style="bold")
        if run.name:
            question.append(f" ({visible(run.name, newlines=False)})", style="bold")
        question.append(f"?\n{describe.lineage(run)}; {own:,} events of its own are deleted.")
        if run.parent is not None:
            question.append(f"\nThe events it shares with run #{run.parent} stay with that run.")
        question.append("\nThis cannot be undone.")
        self.app.push_screen(ConfirmScreen(question, yes="Delete"), lambda yes: self._delete(run_id, yes))

    def _delete(self, run_id: int, yes: bool | None) -> None:
        if not yes:
            return
        self.marked = [m for m in self.marked if m != run_id]
        if self._write(f"delete run #{run_id}", lambda store: store.delete_run(run_id)):
            self.app.forget_run(run_id)
            self.notify(f"run #{run_id} deleted", markup=False)
