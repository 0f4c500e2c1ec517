"""`tttr open` and `tttr demo`: the Textual app's entry points."""

from __future__ import annotations

import sys
from pathlib import Path

from tttr.app.commands import args as argtypes

DEMO_TASK = "write-line"


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "open", help="open a session database in the TTTR app",
        description="Browse the runs of a session database, step through one run's timeline "
                    "(tokens, tool calls, environment reads), edit a clock, tool result or token "
                    "and fork the run there, and compare any two runs side by side. The file is "
                    "opened read-only; a fork is written by a connection of its own.",
    )
    argtypes.add_database(p, "session database (written by tttr record / tttr demo)")
    p.add_argument("--run", type=argtypes.run_id, help="open this run's timeline directly (default: the list of runs)")
    _model_args(p, "forks")
    p.set_defaults(func=cmd_open)

    p = sub.add_parser(
        "demo", help="record one task with the embedded model, then open the app on it",
        description="Record one task of the suite with the embedded default model (or --model) into a "
                    "fresh session database (progress on the terminal), then open the app on the run.",
    )
    p.add_argument("--task", default=DEMO_TASK, help=f"task to record (default {DEMO_TASK}; `tttr tasks` lists them)")
    p.add_argument("--db", help="new database file (default: tttr-demo-<time>.db in this folder)")
    p.add_argument("--seed", type=argtypes.seed, default=0, help="sampling seed (default 0)")
    p.add_argument("--no-open", action="store_true", help="record only; print the `tttr open` line")
    _model_args(p)
    p.set_defaults(func=cmd_demo)


def _model_args(p, what: str = "the recording and forks") -> None:
    p.add_argument("--model", help=f"model for {what}: GGUF file or Hugging Face folder "
                                   "(default: TTTR_MODEL, then the embedded SmolLM2)")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help=f"let {what} run commands without bubblewrap where the machine refuses namespaces (unsafe)")


def _check_file(store) -> None:
    """Damage inside the file (not only in its header) is found now, by SQLite's quick
    check (tens of ms for a 100k-event run), rather than half way through browsing."""
    from tttr.sessions.store import StoreError

    problems = store.check()
    if problems:
        raise StoreError(f"{store.path} is corrupt ({problems[0]}); restore it from a copy")
    store.runs()


def _check_run(store, run_id: int | None) -> None:
    if run_id is not None:
        store.run(run_id)  # an unknown id fails here with the store's message, before the app starts


def cmd_open(args) -> int:
    from tttr.sessions.store import Store

    if args.model is not None:  # only forks use it, but a wrong one is refused now, not at the first fork
        from tttr.engine.inference.loader import model_source

        model_source(args.model)
    # Read-only: a corrupt, foreign or newer file raises StoreError here, before the
    # terminal is taken over, and nothing is ever written to it by viewing.
    store = Store.open(args.db, create=False, readonly=True)
    try:
        _check_file(store)
        _check_run(store, args.run)
        return _run_app(store, args.run, args)
    finally:
        store.close()


def _run_app(store, run_id: int | None, args) -> int:
    from tttr.app.tui import TTTRApp

    app = TTTRApp(store, run_id=run_id, model=args.model, unsafe_no_sandbox=args.unsafe_no_sandbox)
    app.run()
    return int(app.return_code or 0)


def cmd_demo(args) -> int:
    from datetime import datetime

    from tttr.engine.replay.runs import ReplayError, record
    from tttr.engine.replay.runtime import Runtime
    from tttr.recorders.tasks import load_task
    from tttr.sessions.store import Store

    path = Path(args.db) if args.db else Path(f"tttr-demo-{datetime.now():%Y%m%d-%H%M%S}.db")
    if path.exists():
        raise ReplayError(f"{path} already exists: the demo records into a fresh database; pass a new --db path")
    load_task(args.task)  # an unknown task fails before anything is written
    runtime = Runtime(args.model, kernel_mode="invariant")  # a wrong model path fails here; the load is lazy
    store = Store.open(path, create=True)  # a folder that is missing or not writable: one line, before any progress
    try:
        print("tttr demo: loading the model …", file=sys.stderr, flush=True)
        print(f"tttr demo: recording task {args.task} into {path}", file=sys.stderr, flush=True)
        result = record(store, args.task, runtime=runtime, seed=args.seed,
                        unsafe_no_sandbox=args.unsafe_no_sandbox, progress=_demo_progress)
    finally:
        store.close()
    outcome = "passed" if result.passed else ("failed" if result.passed is False else result.status)
    print(f"\ntttr demo: run {result.run_id}: {len(result.actions)} steps, {outcome}", file=sys.stderr)
    if args.no_open:
        print(f"tttr open {path} --run {result.run_id}")
        return 0
    store = Store.open(path, create=False, readonly=True)
    try:
        return _run_app(store, result.run_id, args)
    finally:
        store.close()


def _demo_progress(done: int, total: int | None, message: str = "") -> None:
    from tttr.sessions.safe_text import visible

    message = visible(message, newlines=False)  # it quotes the model's command
    width = 30
    if total:
        filled = min(width, int(width * done / total))
        bar = "█" * filled + "·" * (width - filled)
        line = f"\r  [{bar}] {done}/{total} {message}"
    else:
        line = f"\r  {done} … {message}"
    print(f"{line[:100]:<100}", end="", file=sys.stderr, flush=True)
