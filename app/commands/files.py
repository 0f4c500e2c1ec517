"""`tttr files`: a run's sandbox files after any step, and what differs between two steps
of a run or the same step of two runs, from the trace layer's snapshots. Read-only.

A thin layer over `tttr.recorders.treestate`; everything it prints comes from the
database, so it is shown with its control characters visible and never as markup."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone

from tttr.app.commands import args as argtypes
from tttr.sessions.vocabulary import SETUP, SETUP_STEP


def _step_written(step: int) -> str:
    """A step as sites write it: `setup` for the setup step."""
    return SETUP if step == SETUP_STEP else str(step)


def _step(text: str) -> int:
    """An agent step, or the setup step as `setup` (or -1)."""
    if text.strip() == SETUP:
        return SETUP_STEP
    return argtypes.sandbox_step(text)


_step.__name__ = "a step (0, 1, … or setup)"


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "files",
        help="a run's files after any step, and the difference between two steps or two runs",
        description="The sandbox's files after a step of a run (default: its last), from the trace layer's "
                    "snapshots; with --diff, what changed from one step to another (added, removed, changed, "
                    "with a text diff); with --against, the same step of another run. Binary and large files "
                    "are named, not printed; with --blame PATH, the step and command that last wrote it. Read-only.",
    )
    argtypes.add_database(p, "session database file")
    p.add_argument("run", metavar="RUN", type=argtypes.run_id, help="run id (see `tttr runs DB`)")
    p.add_argument("--step", type=_step, metavar="S",
                   help="the step whose resulting files to show: 0, 1, … or setup (default: the last; "
                        "with --diff, the step before S2)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--diff", type=_step, metavar="S2", help="what changed from step S to step S2")
    what.add_argument("--against", type=argtypes.run_id, metavar="RUN2",
                      help="what differs between RUN and RUN2 after the same step")
    what.add_argument("--blame", metavar="PATH",
                      help="the step and command that last wrote (or removed) PATH, as of step S (default: the last)")
    p.add_argument("--path", metavar="P", help="only this file (its contents) or directory")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=files)


def files(args: argparse.Namespace) -> int:
    from tttr.app.commands.store import _open
    from tttr.recorders.treestate import RunTrees, diff_trees  # imported when the command runs: parsing stays fast

    with _open(args.db) as store:
        trees = RunTrees(store, args.run)
        if args.blame is not None:
            _show_blame(store, trees, args)
            return 0
        if args.diff is None and args.against is None:
            tree = trees.at(trees.last_step if args.step is None else args.step)
            _show_tree(store, tree, args)
            return 0
        if args.diff is not None:
            step = max(-1, args.diff - 1) if args.step is None else args.step
            b = trees.at(args.diff)  # first: a missing S2 is named as given, not as the step before it
            a = trees.at(step)
        else:
            other = RunTrees(store, args.against)
            a, b = trees.at_or_final(args.step), other.at_or_final(args.step)
        _show_diff(store, diff_trees(a, b), args)
    return 0


def _show_blame(store, trees, args) -> None:
    from tttr.app.commands.store import safe_json
    from tttr.engine.blame import blame
    from tttr.sessions.safe_text import visible

    found = blame(store, args.run, args.blame, args.step, trees=trees)
    if args.json:
        print(safe_json(found.to_json()))
        return
    print(visible(found.describe(), newlines=False))


def _in_path(path: str, wanted: str | None) -> bool:
    if wanted is None:
        return True
    wanted = wanted.strip("/")
    return wanted in ("", ".") or path == wanted or path.startswith(wanted + "/")


def _time(ns) -> str:
    try:
        return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def _entry_json(entry) -> dict:
    from tttr.recorders.treestate import mode_text

    return {"path": entry.path, "kind": entry.kind, "mode": mode_text(entry), "size": entry.size,
            "mtime": _time(entry.mtime_ns), "ref": entry.ref}


def _where(tree) -> dict:
    return {"run": tree.run, "step": tree.step, "site": tree.site, "tree": tree.digest, "note": tree.note}


def _refuse_missing(tree, wanted: str) -> None:
    from tttr.recorders.treestate import TreeStateError

    raise TreeStateError(f"no file or directory {wanted!r} in run {tree.run} after step {_step_written(tree.step)}")


def _show_tree(store, tree, args) -> None:
    from tttr.app.commands.store import _console, safe_json, shown
    from tttr.recorders.treestate import TreeStateError, file_text, mode_text
    from tttr.sessions.safe_text import visible

    if tree.note is not None:
        raise TreeStateError(f"run {tree.run} after step {_step_written(tree.step)}: {tree.note}")
    wanted = args.path.strip("/") if args.path else None
    entries = [e for e in tree.files.values() if _in_path(e.path, wanted)]
    if wanted and not entries:
        _refuse_missing(tree, args.path)
    single = entries[0] if wanted and len(entries) == 1 and entries[0].path == wanted and entries[0].kind != "d" \
        else None
    if args.json:
        doc = {**_where(tree), "files": [_entry_json(e) for e in entries]}
        if single is not None:
            content = file_text(store, single)
            doc.update(text=content.text, text_note=content.note)
        print(safe_json(doc))
        return
    if single is not None:
        content = file_text(store, single)
        if content.text is None:
            print(visible(f"{single.path}: {content.note}", newlines=False))
        else:
            sys.stdout.write(visible(content.text))
        return
    console = _console()
    console.print(shown(f"run {tree.run} after step {_step_written(tree.step)} ({tree.site}): {len(entries)} entries, "
                        f"tree {str(tree.digest)[:12]}"))
    for e in entries:
        size = "" if e.kind == "d" else f"{e.size:,}" if isinstance(e.size, int) else "?"
        target = f" -> {e.ref}" if e.kind == "l" else "/" if e.kind == "d" else ""
        console.print(shown(f"{mode_text(e)} {size:>10} {_time(e.mtime_ns)}  {e.path}{target}"))


MARK = {"added": "+", "removed": "-", "changed": "~"}


def _show_diff(store, diff, args) -> None:
    from tttr.app.commands.store import _console, safe_json, shown
    from tttr.recorders.treestate import TreeStateError, change_text, text_diff

    if diff.note is not None:
        raise TreeStateError(f"the files cannot be compared: {diff.note}")
    changes = [c for c in diff.changes if _in_path(c.path, args.path)]
    texts = {c.path: text_diff(store, c) for c in changes}
    if args.json:
        print(safe_json({"a": _where(diff.a), "b": _where(diff.b), "same": not changes, "changes": [
            {"path": c.path, "change": c.change, "what": c.what,
             "before": None if c.before is None else _entry_json(c.before),
             "after": None if c.after is None else _entry_json(c.after),
             "diff": texts[c.path].text, "note": texts[c.path].note} for c in changes]}))
        return
    console = _console()
    a, b = diff.a, diff.b
    sa, sb = _step_written(a.step), _step_written(b.step)
    head = f"run {a.run} step {sa}" + (f" → step {sb}" if a.run == b.run else f" → run {b.run} step {sb}")
    counts = {k: sum(1 for c in changes if c.change == k) for k in MARK}
    if not changes:
        console.print(shown(f"{head}: no file differs" + (f" under {args.path}" if args.path else "")))
        return
    console.print(shown(f"{head}: " + ", ".join(f"{n} {k}" for k, n in counts.items())))
    for c in changes:
        console.print(shown(f"  {MARK[c.change]} {c.path}  ({change_text(c)})"))
    for c in changes:
        shown_text = texts[c.path]
        console.print(shown(f"── {MARK[c.change]} {c.path}", "bold"))
        if shown_text.text:
            for line in shown_text.text.splitlines():
                style = "green" if line.startswith("+") else "red" if line.startswith("-") else ""
                console.print(shown(line, style))
        if shown_text.note:
            console.print(shown(f"   {shown_text.note}", "dim"))
