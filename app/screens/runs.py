"""The runs screen: every run of the database with its lineage; open one, or mark two
and compare them."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Static

from app import describe

COLUMNS = ("", "run", "task", "model", "kernels", "seed", "steps", "outcome", "status", "lineage")


class RunsScreen(Screen):
    BINDINGS = [
        Binding("enter", "open", "open", priority=False),
        Binding("space", "mark", "mark for diff"),
        Binding("d", "diff", "diff"),
        Binding("r", "reload", "reload"),
    ]

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
        runs = store.runs()
        for run in runs:
            table.add_row(
                Text("●" if run.id in self.marked else "", style="bold magenta"),
                Text(f"#{run.id}", style="bold"),
                run.task,
                describe.short(run.model_id or "", 28),
                run.kernel_mode or "",
                str(run.seed),
                str(store.steps(run.id)),
                describe.outcome_label(run),
                describe.status_label(run),
                describe.lineage(run),
                key=str(run.id),
            )
        if runs:
            table.move_cursor(row=min(row, len(runs) - 1))
        title = Text(self.app.db_path.name, style="bold")
        title.append(f"  · {len(runs)} runs", style="dim")
        if self.marked:
            title.append(f"  · marked for diff: {', '.join(f'#{m}' for m in self.marked)}", style="magenta")
        self.query_one("#runs-title", Static).update(title)

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
            parent = self.app.store.run(current).parent
            if parent is not None:
                pair = [parent, current]
        if len(pair) != 2:
            self.notify("mark two runs with space (or stand on a fork) to compare them", severity="warning")
            return
        from app.screens.compare import CompareScreen

        self.app.push_screen(CompareScreen(pair[0], pair[1]))
