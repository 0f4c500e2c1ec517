"""`tttr info`, `tttr runs`, `tttr events`, `tttr prompt`: look inside a session database, read-only.

Reading commands open the file read-only and never create or migrate it, so a wrong path
or a foreign file is reported and left exactly as it was. Everything read from the file is
untrusted: it is printed with its control characters made visible (`sessions.safe_text`)
and handed to Rich as `Text`, never as markup.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from tttr.app.commands import args as argtypes
from tttr.sessions.export import safe_json  # noqa: F401 - also used by the other commands
from tttr.sessions.vocabulary import LAYERS  # no imports of its own: `tttr --help` stays fast

if TYPE_CHECKING:  # rich loads in the handlers, so that `tttr --help` stays fast
    from rich.text import Text

HUMAN_LIMIT = 100
STATUS_STYLE = {"complete": "green", "recording": "cyan", "incomplete": "yellow", "failed": "red"}


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "info",
        help="summarize a session database: schema, runs, events, blobs, integrity",
        description="Summarize a session database and check its integrity (PRAGMA quick_check). Read-only.",
    )
    argtypes.add_database(p, "session database file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=info)

    p = sub.add_parser("runs", help="list the runs in a session database",
                       description="List the runs by id, printed as they are read (a window of runs at a "
                                   "time, so a database of any size starts printing at once). Read-only.")
    argtypes.add_database(p, "session database file")
    p.add_argument("--json", action="store_true", help="print one JSON object per run")
    p.add_argument("--offset", metavar="K", type=argtypes.count, default=0,
                   help="skip the first K runs (by id; default 0)")
    p.add_argument("--limit", metavar="N", type=argtypes.count, help="at most N runs (default: all)")
    p.set_defaults(func=runs)

    p = sub.add_parser(
        "events",
        help="print a run's events, by window and filter",
        description="Print a run's events in seq order; a fork shows its parent's prefix then its own. Read-only.",
    )
    argtypes.add_database(p, "session database file")
    p.add_argument("run", metavar="RUN", type=argtypes.run_id, help="run id (see `tttr runs DB`)")
    p.add_argument("--layer", choices=LAYERS, help="only this layer (default: every layer)")
    p.add_argument("--kind", metavar="K", help="only this kind: token, logits, clock, tool, message, action, ... (default: every kind)")
    p.add_argument("--from", dest="start", metavar="SEQ", type=argtypes.count, default=0, help="first seq (default 0)")
    p.add_argument(
        "--limit", metavar="N", type=argtypes.count,
        help=f"at most N events (default: {HUMAN_LIMIT} in a table, all with --json)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line: run, seq, step, layer, kind, site, value, origin")
    p.add_argument("--format", choices=("table", "jsonl", "md"), default="table",
                   help="table (default), jsonl (as --json) or md: a Markdown table, as the app's export writes")
    p.add_argument("--timing", action="store_true",
                   help="each step's model, tool and wait time (ms) instead of the events (--json: one object)")
    p.set_defaults(func=events)

    p = sub.add_parser(
        "prompt",
        help="the prompt the model saw at each step of a run, as text",
        description="Rebuild the text of each step's prompt from the record (the task, the earlier "
                    "messages and tool results, the model's chat template; a served call's recorded "
                    "ids) and check it: 'verified' means it encodes to the very token ids the model "
                    "read (their recorded digest). Read-only; loads the tokenizer, not the weights.",
    )
    argtypes.add_database(p, "session database file")
    p.add_argument("run", metavar="RUN", type=argtypes.run_id, help="run id (see `tttr runs DB`)")
    p.add_argument("--step", type=argtypes.count, help="only this step (default: every step)")
    p.add_argument("--model", default=None,
                   help="the run's model file, when it is not where the run recorded it (default: that path, "
                        "else $TTTR_MODEL, else the embedded default)")
    p.add_argument("--json", action="store_true", help="one JSON object per step: step, n_tokens, verified, note, text")
    p.set_defaults(func=prompt)

    _register_manage(sub)


def _open(path: str):
    from tttr.sessions.store import Store

    return Store.open(path, create=False, readonly=True)


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def shown(value: object, style: str = "") -> Text:
    """Text from the file (or the command line) as Rich `Text` on one line: control
    characters visible, brackets literal."""
    from rich.text import Text

    from tttr.sessions.safe_text import visible

    return Text(visible("" if value is None else value, newlines=False), style=style)




def info(args: argparse.Namespace) -> int:
    from tttr.sessions.store import StoreError

    with _open(args.db) as store:
        stats = store.stats()
        problems = store.check()
        from tttr.engine.traces.kind import imported_note  # what runs imported from traces lack

        imported = imported_note(store.runs())
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise StoreError(f"{args.db} is corrupt: {problems[0]}{more}; restore it from a copy")
    if args.json:
        print(safe_json({**stats, "integrity": "ok", **({"imported": imported} if imported else {})}))
        return 0
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    migrated = "" if stats["schema_version"] == stats["reads_as_version"] else f" (read as {stats['reads_as_version']}; opening it for writing migrates it)"
    statuses = ", ".join(f"{n} {s}" for s, n in stats["statuses"].items() if n)  # a status may be anything the file holds
    table.add_row("file", shown(f"{stats['path']}  {stats['file_bytes']:,} bytes, page size {stats['page_size']}, journal {stats['journal_mode']}"))
    table.add_row("schema", shown(f"version {stats['schema_version']}{migrated}"))
    table.add_row("runs", shown(f"{stats['runs']:,}" + (f"  ({statuses})" if statuses else "")))
    table.add_row("events", shown(f"{stats['events']:,}"))
    table.add_row("blobs", shown(f"{stats['blobs']:,}  ({stats['blob_bytes']:,} bytes, {stats['blob_stored_bytes']:,} stored)"))
    table.add_row("integrity", shown("ok", "green"))
    if imported:
        table.add_row("imported", shown(imported, "yellow"))
    if stats.get("unreadable_runs"):
        table.add_row("unreadable", shown(f"{stats['unreadable_runs']:,} run(s) with metadata of the wrong type (`tttr runs` names them)", "yellow"))
    _console().print(table)
    return 0


def _run_json(row) -> dict:
    run = row.run
    return {**run.to_json(), "steps": row.steps, "events": row.events}


def runs(args: argparse.Namespace) -> int:
    """The runs in id order, read and printed a window at a time (`Store.run_pages`)."""
    with _open(args.db) as store:
        pages = store.run_pages(args.offset, args.limit)
        if args.json:
            for page in pages:
                sys.stdout.write("".join(safe_json(_run_json(row)) + "\n" for row in page))
            return 0
        total = store.count_runs()
        console = _console()
        if not total:
            console.print(shown(f"{args.db}: no runs yet"))
            return 0
        whole = args.offset == 0 and (args.limit is None or args.limit >= total)
        last = total if args.limit is None else min(total, args.offset + args.limit)
        what = f"{total} run(s)" if whole else f"runs {args.offset + 1:,}–{last:,} of {total:,} (by id)"
        console.print(shown(f"{args.db}: {what}" if last > args.offset else
                            f"{args.db}: {total:,} run(s), none from --offset {args.offset}"), soft_wrap=True)
        from tttr.app.commands.streamed_table import StreamedTable

        table = StreamedTable(console, RUN_HEADS, squeeze=("model", "task", "outcome"),
                              right=("run", "seed", "steps", "events"), styled="status")
        problems = []
        for page in pages:
            table.add([[_cell(x) for x in _run_cells(row)] for row in page],
                      ["red" if row.run.problem else STATUS_STYLE.get(row.run.status, "none") for row in page])
            problems += [row.run for row in page if row.run.problem]
        table.close()
    for run in problems:
        console.print(shown(f"run {run.id} cannot be replayed: {run.problem}", "red"))
    return 0


RUN_HEADS = ("run", "status", "task", "model", "kernels", "seed", "lineage", "steps", "events", "outcome", "created (UTC)")


def _run_cells(row) -> list[str]:
    """A run's cells under RUN_HEADS, before their control characters are made visible."""
    r = row.run
    from tttr.app.describe import lineage

    parent = "" if r.parent is None else lineage(r).split(" = ")[0]  # `fork of #1 at 2:tool`, `replay of #1 (faithful)`
    outcome = r.outcome
    if outcome is not None and "passed" in outcome:
        outcome = "passed" if outcome.passed else "failed check"
    elif outcome is not None:
        outcome = json.dumps(outcome.to_json(), ensure_ascii=False)[:40]
    return [
        str(r.id) + (f" {r.name}" if r.name else ""), r.status + (" (unreadable)" if r.problem else ""),
        r.task or "", r.model_id or "", r.kernel_mode or "", "" if r.seed is None else str(r.seed), parent,
        f"{row.steps:,}", f"{row.events:,}", outcome or "", (r.created or "")[:16].replace("T", " "),
    ]


def _cell(value: str) -> str:
    """A table cell's text: one line, control characters visible (widths are measured on this)."""
    from tttr.sessions.safe_text import visible

    return visible(value, newlines=False)


def _fitted_table(console, title: str, heads, cells, *, squeeze, right):
    """A table whose columns keep their full width, except `squeeze` ones, which are cut
    (with an ellipsis) to fit the terminal; rich would otherwise collapse whole columns."""
    from rich.table import Table

    widths = {h: max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)}
    room = console.width - 3 * len(heads) - 1
    for head in squeeze:
        over = sum(widths.values()) - room
        if over > 0:
            widths[head] = max(min(widths[head], 8), widths[head] - over)
    table = Table(title=title, title_justify="left")  # title: Text, never markup
    for head in heads:
        table.add_column(head, no_wrap=True, overflow="ellipsis", width=widths[head],
                         justify="right" if head in right else "left")
    if sum(widths.values()) > room:
        console.width = sum(widths.values()) + 3 * len(heads) + 1  # wrap the lines rather than drop columns
    return table


def events(args: argparse.Namespace) -> int:
    from tttr.sessions.store import StoreError

    if args.start < 0 or (args.limit is not None and args.limit < 0):
        raise StoreError(f"--from and --limit take numbers >= 0, not {args.start} and {args.limit}")
    if args.json and args.format == "md":
        raise StoreError("--json and --format md ask for two formats: give one (--json is --format jsonl)")
    from tttr.sessions.vocabulary import KIND_LAYER

    if args.layer and KIND_LAYER.get(args.kind, args.layer) != args.layer:  # a filter no event can pass
        raise StoreError(f"kind {args.kind} is in layer {KIND_LAYER[args.kind]}, not {args.layer}: "
                         "drop --layer or give its layer")
    if args.timing and (args.layer or args.kind or args.start or args.limit is not None or args.format != "table"):
        raise StoreError("--timing prints each step's time, not events: drop --layer, --kind, --from, --limit and --format")
    with _open(args.db) as store:
        run = store.run(args.run)  # an unknown run fails here, with the ids there are
        if args.timing:
            from tttr.app.commands.step_timing import print_timing

            return print_timing(store, args.run, args.json)
        if args.json or args.format != "table":
            from tttr.sessions import export

            found = export.iter_events(store, args.run, args.start, args.limit, layer=args.layer, kind=args.kind)
            if args.json or args.format == "jsonl":
                export.write_events_jsonl(found, sys.stdout)
            else:
                export.write_events_md(run, found, sys.stdout)
            return 0
        limit = HUMAN_LIMIT if args.limit is None else args.limit
        found = store.events(args.run, args.start, None, layer=args.layer, kind=args.kind, limit=limit + 1)
        total = store.count_events(args.run)
    _print_table(args, found[:limit], more=len(found) > limit, total=total)
    return 0


def _print_table(args, found, *, more: bool, total: int) -> None:
    console = _console()
    what = " ".join(x for x in (args.layer and f"layer {args.layer}", args.kind and f"kind {args.kind}") if x)
    title = f"run {args.run}: {total:,} events" + (f", showing {what}" if what else "")
    if not found:
        console.print(shown(f"{title}: none from seq {args.start}"))
        return
    fork = any(e.origin != e.run for e in found)
    cells = [
        [str(e.seq), _cell(e.site), _cell(e.layer), _cell(e.kind), _value_cell(e)]
        + ([("" if e.origin == e.run else str(e.origin))] if fork else [])
        for e in found
    ]
    heads = ["seq", "site", "layer", "kind", "value"] + (["from run"] if fork else [])
    table = _fitted_table(console, shown(title), heads, cells, squeeze=("value",), right=("seq", "from run"))
    for e, c in zip(found, cells):
        table.add_row(*(shown(x, "red" if e.problem and i == 4 else "") for i, x in enumerate(c)))
    console.print(table)
    if more:
        console.print(shown(f"more after seq {found[-1].seq}: `tttr events {args.db} {args.run} --from {found[-1].seq + 1}` (or --limit N, --json)"))


def _value_cell(e) -> str:
    if e.problem:
        return _cell(f"unreadable: {e.problem}")
    return _cell(json.dumps(e.value, ensure_ascii=False)[:500])


def prompt(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tttr.engine.replay.prompts import prompts
    from tttr.engine.replay.runtime import Runtime
    from tttr.sessions.safe_text import visible
    from tttr.sessions.store import StoreError

    with _open(args.db) as store:
        run = store.run(args.run)  # an unknown run fails here, with the ids there are
        model = args.model
        recorded_path = (run.fingerprint or {}).get("model_path") if isinstance(run.fingerprint, dict) else None
        if model is None and isinstance(recorded_path, str) and Path(recorded_path).is_file():
            model = recorded_path
        found = [p for p in prompts(store, args.run, Runtime(model).tokenizer) if args.step in (None, p.step)]
    if not found:
        raise StoreError(f"run {args.run} has no prompt" + (f" at step {args.step}" if args.step is not None else ""))
    for p in found:
        if args.json:
            print(json.dumps({"step": p.step, "n_tokens": p.n_tokens, "verified": p.verified, "note": p.note,
                              "text": p.text}, ensure_ascii=False))
            continue
        state = "verified" if p.verified else f"NOT verified: {p.note}"
        print(visible(f"── step {p.step}: {p.n_tokens} tokens, {state}", newlines=False))
        print(visible(p.text))
    return 0


# -- managing runs: the two commands here that write ----------------------------------------
def _register_manage(sub) -> None:
    p = sub.add_parser(
        "rename", help="give a run a name, shown in `tttr runs` and the app",
        description="Give a run a name (1-80 printable characters; '' is refused). Only the run's row "
                    "changes: its events and every other run stay as they are.",
    )
    p.add_argument("run", metavar="RUN", type=argtypes.run_id, help="run id (see `tttr runs DB`)")
    p.add_argument("name", metavar="NAME", help="the new name")
    p.add_argument("--db", required=True, metavar="DB", help="the session database")
    p.set_defaults(func=rename)

    p = sub.add_parser(
        "delete", help="delete a run (a fork: only its own events; its parent's stay)",
        description="Delete a run: its row and the events it recorded itself. A fork's shared prefix "
                    "belongs to its parent and stays; no other run is touched. A run that has forks or "
                    "replays is refused until they are deleted; a run being recorded is refused. Asks "
                    "first unless --yes.",
    )
    p.add_argument("run", metavar="RUN", type=argtypes.run_id, help="run id (see `tttr runs DB`)")
    p.add_argument("--db", required=True, metavar="DB", help="the session database")
    p.add_argument("--yes", action="store_true", help="delete without asking")
    p.set_defaults(func=delete)

    p = sub.add_parser(
        "gc", help="remove the blobs no run refers to any more (after `tttr delete`)",
        description="Remove the stored blobs (tool outputs, file contents, snapshots) that no run refers "
                    "to any more: what deleted runs left behind. A blob any run may still use is kept "
                    "(the search errs on the side of keeping). Refused while a run is being recorded. "
                    "--vacuum then rebuilds the file so it shrinks on disk.",
    )
    p.add_argument("--db", required=True, metavar="DB", help="the session database")
    p.add_argument("--dry-run", action="store_true", help="count what would be removed; change nothing")
    p.add_argument("--vacuum", action="store_true", help="also rebuild the file without its free pages")
    p.set_defaults(func=gc)

def _open_writable(path: str):
    from tttr.sessions.store import Store

    return Store.open(path, create=False)


def rename(args: argparse.Namespace) -> int:
    with _open_writable(args.db) as store:
        store.rename_run(args.run, args.name)
        name = store.run(args.run).name
    _console().print(shown(f"run {args.run} is now named {name!r}"))
    return 0


def gc(args: argparse.Namespace) -> int:
    import os

    if args.dry_run and args.vacuum:
        from tttr.sessions.errors import TTTRError

        raise TTTRError("--dry-run changes nothing, so it cannot --vacuum: pass one of them")
    with _open_writable(args.db) as store:
        before = os.path.getsize(store.path)
        found = store.collect_blobs(dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        line = f"{verb} {found.removed:,} unused blob(s), {found.freed_bytes / 1024:,.1f} KiB stored; kept {found.kept:,}"
        if args.vacuum:
            store.vacuum()
    if args.vacuum:
        line += f"; file {before / 1024:,.0f} KiB -> {os.path.getsize(args.db) / 1024:,.0f} KiB"
    elif found.removed and not args.dry_run:
        line += " (the file reuses the space; --vacuum shrinks it)"
    _console().print(shown(line))
    return 0


def delete(args: argparse.Namespace) -> int:
    from tttr.app.describe import lineage
    from tttr.sessions.store import StoreError

    with _open_writable(args.db) as store:
        run = store.run(args.run)  # an unknown run fails here, with the ids there are
        kids = store.children(args.run)
        if kids:  # refused before asking
            store.delete_run(args.run)
        own = store.own_events(args.run)
        what = f"run {args.run} ({run.name or run.task or 'no task'}, {lineage(run)}, {own:,} events of its own)"
        if not args.yes:
            if not sys.stdin.isatty():
                raise StoreError(f"not deleting {what} without asking: pass --yes to delete it from a script")
            answer = input(shown(f"delete {what}? [y/N] ").plain)
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 1
        store.delete_run(args.run)
    _console().print(shown(f"deleted {what}; `tttr gc --db {args.db}` removes the blobs no run uses any more"))
    return 0
