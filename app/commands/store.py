"""`tttr info`, `tttr runs`, `tttr events`: look inside a session database, read-only.
`tttr bench store`: how fast and how small the store is.

Reading commands open the file read-only and never create or migrate it, so a wrong path
or a foreign file is reported and left exactly as it was.
"""

from __future__ import annotations

import argparse
import json
import sys

LAYERS = ("tensor", "token", "trace", "agent")  # sessions.store.LAYERS, without importing it for --help
HUMAN_LIMIT = 100
JSON_CHUNK = 5000
STATUS_STYLE = {"complete": "green", "recording": "cyan", "incomplete": "yellow", "failed": "red"}


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "info",
        help="summarize a session database: schema, runs, events, blobs, integrity",
        description="Summarize a session database and check its integrity (PRAGMA quick_check). Read-only.",
    )
    p.add_argument("db", metavar="DB", help="session database file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=info)

    p = sub.add_parser("runs", help="list the runs in a session database", description="List the runs. Read-only.")
    p.add_argument("db", metavar="DB", help="session database file")
    p.add_argument("--json", action="store_true", help="print one JSON object per run")
    p.set_defaults(func=runs)

    p = sub.add_parser(
        "events",
        help="print a run's events, by window and filter",
        description="Print a run's events in seq order; a fork shows its parent's prefix then its own. Read-only.",
    )
    p.add_argument("db", metavar="DB", help="session database file")
    p.add_argument("run", metavar="RUN", type=int, help="run id (see `tttr runs DB`)")
    p.add_argument("--layer", choices=LAYERS, help="only this layer")
    p.add_argument("--kind", metavar="K", help="only this kind (token, logits, clock, tool, message, action, ...)")
    p.add_argument("--from", dest="start", metavar="SEQ", type=int, default=0, help="first seq (default 0)")
    p.add_argument(
        "--limit", metavar="N", type=int,
        help=f"at most N events (default: {HUMAN_LIMIT} in a table, all with --json)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object per line: run, seq, step, layer, kind, site, value, origin")
    p.set_defaults(func=events)

    p = bench_sub.add_parser(
        "store",
        help="session store: append rate, window read time, bytes per event",
        description="Append 100k token events in steps of 50, open a 1M-event database and read a "
        "200-event window from its middle, and measure bytes per event on disk.",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--events", type=int, default=100_000, help="token events to append (default 100,000)")
    p.add_argument("--window-events", type=int, default=1_000_000, help="events in the window database (default 1,000,000)")
    p.set_defaults(func=bench)


def _open(path: str):
    from sessions.store import Store

    return Store.open(path, create=False, readonly=True)


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def info(args: argparse.Namespace) -> int:
    from sessions.store import StoreError

    with _open(args.db) as store:
        stats = store.stats()
        problems = store.check()
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise StoreError(f"{args.db} is corrupt: {problems[0]}{more}; restore it from a copy")
    if args.json:
        print(json.dumps({**stats, "integrity": "ok"}))
        return 0
    from rich.table import Table

    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    migrated = "" if stats["schema_version"] == stats["reads_as_version"] else f" (read as {stats['reads_as_version']}; opening it for writing migrates it)"
    statuses = ", ".join(f"{n} {s}" for s, n in stats["statuses"].items() if n)
    table.add_row("file", f"{stats['path']}  {stats['file_bytes']:,} bytes, page size {stats['page_size']}, journal {stats['journal_mode']}")
    table.add_row("schema", f"version {stats['schema_version']}{migrated}")
    table.add_row("runs", f"{stats['runs']:,}" + (f"  ({statuses})" if statuses else ""))
    table.add_row("events", f"{stats['events']:,}")
    table.add_row("blobs", f"{stats['blobs']:,}  ({stats['blob_bytes']:,} bytes, {stats['blob_stored_bytes']:,} stored)")
    table.add_row("integrity", "[green]ok[/]")
    _console().print(table)
    return 0


def _run_json(store, run) -> dict:
    from dataclasses import asdict

    return {**asdict(run), "steps": store.steps(run.id), "events": store.count_events(run.id)}


def runs(args: argparse.Namespace) -> int:
    with _open(args.db) as store:
        rows = [_run_json(store, r) for r in store.runs()]
    if args.json:
        for row in rows:
            print(json.dumps(row))
        return 0
    from rich.markup import escape

    console = _console()
    if not rows:
        console.print(f"{args.db}: no runs yet")
        return 0
    cells = []
    for r in rows:
        parent = "" if r["parent"] is None else f"{r['parent']} @ {r['fork_site'] or 'seq ' + str(r['fork_seq'])}"
        outcome = r["outcome"]
        if isinstance(outcome, dict) and "passed" in outcome:
            outcome = "passed" if outcome["passed"] else "failed check"
        elif outcome is not None:
            outcome = json.dumps(outcome)[:40]
        cells.append([
            str(r["id"]), r["status"], r["task"] or "", r["model_id"] or "", r["kernel_mode"] or "",
            "" if r["seed"] is None else str(r["seed"]), parent, f"{r['steps']:,}", f"{r['events']:,}",
            outcome or "", (r["created"] or "")[:16].replace("T", " "),
        ])
    heads = ("run", "status", "task", "model", "kernels", "seed", "parent", "steps", "events", "outcome", "created (UTC)")
    right = ("run", "seed", "steps", "events")
    table = _fitted_table(console, f"{args.db}: {len(rows)} run(s)", heads, cells, squeeze=("model", "task", "outcome"), right=right)
    for c in cells:
        style = STATUS_STYLE.get(c[1], "none")
        table.add_row(*(f"[{style}]{c[1]}[/]" if i == 1 else escape(x) for i, x in enumerate(c)))
    console.print(table)
    return 0


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
    table = Table(title=title, title_justify="left")
    for head in heads:
        table.add_column(head, no_wrap=True, overflow="ellipsis", width=widths[head],
                         justify="right" if head in right else "left")
    if sum(widths.values()) > room:
        console.width = sum(widths.values()) + 3 * len(heads) + 1  # wrap the lines rather than drop columns
    return table


def _event_json(e) -> str:
    return json.dumps(
        {"run": e.run, "seq": e.seq, "step": e.step, "layer": e.layer, "kind": e.kind, "site": e.site,
         "value": e.value, "origin": e.origin},
        ensure_ascii=False,
    )


def events(args: argparse.Namespace) -> int:
    from sessions.store import StoreError

    if args.start < 0 or (args.limit is not None and args.limit < 0):
        raise StoreError(f"--from and --limit take numbers >= 0, not {args.start} and {args.limit}")
    with _open(args.db) as store:
        store.run(args.run)  # an unknown run fails here, with the ids there are
        if args.json:
            _print_json(store, args)
            return 0
        limit = HUMAN_LIMIT if args.limit is None else args.limit
        found = store.events(args.run, args.start, None, layer=args.layer, kind=args.kind, limit=limit + 1)
        total = store.count_events(args.run)
    _print_table(args, found[:limit], more=len(found) > limit, total=total)
    return 0


def _print_json(store, args) -> None:
    start, left = args.start, args.limit
    out = sys.stdout
    while left is None or left > 0:
        chunk = JSON_CHUNK if left is None else min(JSON_CHUNK, left)
        window = store.events(args.run, start, None, layer=args.layer, kind=args.kind, limit=chunk)
        for e in window:
            out.write(_event_json(e) + "\n")
        if len(window) < chunk:
            break
        start = window[-1].seq + 1
        left = None if left is None else left - len(window)


def _print_table(args, found, *, more: bool, total: int) -> None:
    from rich.markup import escape

    console = _console()
    what = " ".join(x for x in (args.layer and f"layer {args.layer}", args.kind and f"kind {args.kind}") if x)
    title = f"run {args.run}: {total:,} events" + (f", showing {what}" if what else "")
    if not found:
        console.print(f"{title}: none from seq {args.start}")
        return
    fork = any(e.origin != e.run for e in found)
    cells = [
        [str(e.seq), e.site, e.layer, e.kind, json.dumps(e.value, ensure_ascii=False)[:500]]
        + ([("" if e.origin == e.run else str(e.origin))] if fork else [])
        for e in found
    ]
    heads = ["seq", "site", "layer", "kind", "value"] + (["from run"] if fork else [])
    table = _fitted_table(console, title, heads, cells, squeeze=("value",), right=("seq", "from run"))
    for c in cells:
        c[4] = escape(c[4])
        table.add_row(*c)
    console.print(table)
    if more:
        console.print(f"more after seq {found[-1].seq}: `tttr events {args.db} {args.run} --from {found[-1].seq + 1}` (or --limit N, --json)")


def bench(args: argparse.Namespace) -> int:
    from sessions import bench as store_bench

    result = store_bench.run(events=args.events, window_events=args.window_events)
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(store_bench.lines(result)))
    return 0
