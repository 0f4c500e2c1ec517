"""The runs screen: every run of the database, forks as a tree under their parent; open
one, mark two and compare them, name or delete a run. It follows the file: a run still
being recorded grows on screen, and runs another process adds or finishes appear."""

from __future__ import annotations

from collections import defaultdict

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tttr.app import describe
from tttr.app.screens.confirm import ConfirmScreen
from tttr.app.screens.footer import FittedFooter
from tttr.sessions.safe_text import visible

COLUMNS = ("", "run", "task", "model", "kernels", "seed", "steps", "outcome", "status", "lineage")
POLL_S = 0.5  # how often the screen asks the file whether anything was committed (one PRAGMA)
LIVE_POLLS = 4  # while a run reads "recording", list again every this many polls (its writer may die)
MAX_DEPTH = 12  # tree levels drawn; a deeper fork is shown at this depth, its depth written out


def fork_tree(runs: list) -> list[tuple[object, str]]:
    """(run, tree prefix) in display order: each run, then its forks and replays under it,
    recursively, by id. A run whose parent is not listed (or a cycle a hand-edited file
    made) is shown as a root, so every run is shown once."""
    ids = {run.id for run in runs}
    children: dict[int, list] = defaultdict(list)
    roots = []
    for run in runs:
        parent = run.parent
        if isinstance(parent, int) and parent in ids and parent != run.id:
            children[parent].append(run)
        else:
            roots.append(run)
    out: list[tuple[object, str]] = []
    seen: set[int] = set()

    def walk(root) -> None:
        stack = [(root, "", "", 0)]  # (run, prefix of its children's lines, its own glyph, depth)
        while stack:
            run, prefix, glyph, depth = stack.pop()
            if run.id in seen:
                continue
            seen.add(run.id)
            out.append((run, prefix + glyph if depth <= MAX_DEPTH else f"{prefix}…{depth} {glyph}"))
            kids = children.get(run.id, [])
            below = prefix if depth == 0 or depth >= MAX_DEPTH else prefix + ("   " if glyph == "└─ " else "│  ")
            for i in range(len(kids) - 1, -1, -1):
                stack.append((kids[i], below, "└─ " if i == len(kids) - 1 else "├─ ", depth + 1))

    for run in roots:
        walk(run)
    for run in runs:  # only a cycle of parents leaves runs unreached
        walk(run)
    return out


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
    ]
    place = "runs"  # what a screen above says `escape` goes back to

    def __init__(self) -> None:
        super().__init__()
        self.marked: list[int] = []
        self.seen_version: int | None = None  # the file's data_version when last listed
        self.live = False  # some run reads "recording"
        self.polls = 0

    def compose(self) -> ComposeResult:
        yield Static("", id="runs-title")
        yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for column in COLUMNS:
            table.add_column(column, key=column or "mark")
        self.action_reload()
        table.focus()
        self.set_interval(POLL_S, self.poll)

    def on_screen_resume(self) -> None:
        self.action_reload()

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
        store = self.app.store
        table = self.query_one(DataTable)
        current, row = self._current(), table.cursor_row
        table.clear()
        title = Text(visible(self.app.db_path.name, newlines=False), style="bold")
        try:
            self.seen_version = store.data_version()
            runs = store.runs()
        except Exception as exc:  # noqa: BLE001 - a database whose runs do not read is reported
            title.append(f"  · cannot list the runs: {describe.short(exc, 200)}", style="bold red")
            self.query_one("#runs-title", Static).update(title)
            return
        self.marked = [m for m in self.marked if any(run.id == m for run in runs)]
        by_id = {run.id: run for run in runs}
        for run, prefix in fork_tree(runs):
            table.add_row(*self._cells(store, run, prefix, by_id), key=str(run.id))
        if runs:
            keys = {run.id for run in runs}
            row = table.get_row_index(str(current)) if current in keys else min(row, len(runs) - 1)
            table.move_cursor(row=row, scroll=False)
        self.live = any(run.status == "recording" for run in runs)
        title.append(f"  · {len(runs)} runs", style="dim")
        recording = [run.id for run in runs if run.status == "recording"]
        if recording:
            title.append(f"  · recording: {', '.join(f'#{r}' for r in recording)}", style="cyan")
        if self.marked:
            title.append(f"  · marked for diff: {', '.join(f'#{m}' for m in self.marked)}", style="magenta")
        self.query_one("#runs-title", Static).update(title)

    def _cells(self, store, run, prefix: str = "", runs: dict | None = None) -> list[Text]:
        """One row of the table. Every cell is Text: a DataTable reads a str cell as markup,
        and recorded text is never markup."""
        try:
            steps = str(store.steps(run.id))
        except Exception:  # noqa: BLE001 - a count the store cannot give is unknown
            steps = "?"
        label = Text(prefix, style="dim")
        label.append(f"#{run.id}", style="bold")
        if run.name:
            label.append(" " + describe.short(run.name, 40), style="italic")
        return [
            Text("●" if run.id in self.marked else "", style="bold magenta"),
            label,
            Text(describe.short(describe.task_label(run, runs), 40)),  # a recorded program: its command line
            Text(describe.short(run.model_id or "", 28)),
            Text(describe.short(run.kernel_mode or "", 12)),
            Text(describe.short(run.seed, 20)),
            Text(steps),
            describe.outcome_label(run),
            describe.status_label(run),
            describe.run_problem(run) or Text(describe.lineage(run)),
        ]

    def _current(self) -> int | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return int(key.value)

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
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked = (self.marked + [run_id])[-2:]
        self.action_reload()

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
