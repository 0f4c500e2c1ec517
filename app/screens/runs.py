"""The runs screen: every run of the database with its lineage; open one, or mark two
and compare them."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from tttr.app import describe
from tttr.sessions.safe_text import visible

COLUMNS = ("", "run", "task", "model", "kernels", "seed", "steps", "outcome", "status", "lineage")


class RunsScreen(Screen):
    BINDINGS = [
        Binding("enter", "open", "open", priority=False),
        Binding("space", "mark", "mark for diff"),
        Binding("d", "diff", "diff"),
        Binding("r", "reload", "reload"),
    ]
    place = "runs"  # what a screen above says `escape` goes back to

    def __init__(self) -> None:
        super().__init__()
        self.marked: list[int] = []

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

    def on_screen_resume(self) -> None:
        self.action_reload()

    def action_reload(self) -> None:
        store = self.app.store
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        title = Text(visible(self.app.db_path.name, newlines=False), style="bold")
        try:
            runs = store.runs()
        except Exception as exc:  # noqa: BLE001 - a database whose runs do not read is reported
            title.append(f"  · cannot list the runs: {describe.short(exc, 200)}", style="bold red")
            self.query_one("#runs-title", Static).update(title)
            return
        for run in runs:
            table.add_row(*self._cells(store, run), key=str(run.id))
        if runs:
            table.move_cursor(row=min(row, len(runs) - 1))
        title.append(f"  · {len(runs)} runs", style="dim")
        if self.marked:
            title.append(f"  · marked for diff: {', '.join(f'#{m}' for m in self.marked)}", style="magenta")
        self.query_one("#runs-title", Static).update(title)

    def _cells(self, store, run) -> list[Text]:
        """One row of the table. Every cell is Text: a DataTable reads a str cell as markup,
        and recorded text is never markup."""
        try:
            steps = str(store.steps(run.id))
        except Exception:  # noqa: BLE001 - a count the store cannot give is unknown
            steps = "?"
        return [
            Text("●" if run.id in self.marked else "", style="bold magenta"),
            Text(f"#{run.id}", style="bold"),
            Text(describe.short(run.task, 40)),
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
