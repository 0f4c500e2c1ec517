"""The app's export: ask for a file name, then write the run (or the comparison) in a
worker with `sessions.export`, on a connection of its own, and say where it went."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from tttr.app.screens.ask import AskScreen
from tttr.sessions import export
from tttr.sessions.safe_text import visible

HINT = ("a file name ending in .jsonl (JSON Lines: one object per event) or .md (Markdown); "
        "relative to the folder the app was started in; an existing file is not overwritten")


def ask_export(app, run_id: int, other: int | None = None) -> None:
    """Ask where to export run `run_id` (with `other`: the comparison of the two runs)."""
    name = f"run-{run_id}.jsonl" if other is None else f"compare-{run_id}-{other}.md"
    what = f"run #{run_id}" if other is None else f"the comparison of runs #{run_id} and #{other}"
    app.push_screen(AskScreen(f"Export {what} to", HINT, _checked_path, name),
                    partial(_start, app, run_id, other))


def _checked_path(text: str) -> Path:
    path = Path(text.strip()).expanduser()
    if not text.strip():
        raise ValueError("type a file name")
    export.format_for(path)
    if path.exists():
        raise ValueError(f"{visible(str(path), newlines=False)} exists: choose another name")
    if not path.absolute().parent.is_dir():
        raise ValueError(f"no folder {visible(str(path.absolute().parent), newlines=False)}")
    return path.absolute()


def _start(app, run_id: int, other: int | None, path: Path | None) -> None:
    if path is not None:
        app.run_worker(partial(_export, app, run_id, other, path), thread=True, exit_on_error=False,
                       group="export", name=f"export to {path.name}")


def _export(app, run_id: int, other: int | None, path: Path) -> None:
    """In a worker thread. `notify` posts a message, so it is safe from here."""
    from tttr.sessions.store import Store

    shown = visible(str(path), newlines=False)
    try:
        store = Store.open(app.db_path, create=False, readonly=True)
        try:
            if other is None:
                n = export.export_run(store, run_id, path)
                done = f"exported {n:,} events of run #{run_id} to {shown}"
            else:
                from tttr.engine.replay.diff import diff_runs

                n = export.export_compare(diff_runs(store, run_id, other), path)
                done = f"exported the comparison of runs #{run_id} and #{other} ({n} rows) to {shown}"
        finally:
            store.close()
    except Exception as exc:  # noqa: BLE001 - said on screen, the app keeps running
        app.notify(visible(f"export to {path} failed: {exc}", newlines=False), severity="error", timeout=10,
                   markup=False)
        return
    app.notify(done, timeout=8, markup=False)
