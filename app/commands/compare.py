"""`tttr compare` (two suites: the difference in pass rate with 95% intervals, pass@k, pass^k,
agreement by layer, power) and `tttr merge` (session databases into one), issue 30. The work
is `tttr.engine.replay.comparison` and `tttr.sessions.merge`; this parses and prints."""

from __future__ import annotations

from pathlib import Path

from tttr.app.commands.agent import DEFAULT_DB

NOTES = (
    "free runs only (a fresh seed and the live clock each: today's practice), over the tasks both suites ran;",
    "intervals are 95%: per task Newcombe's (from Wilson's), overall mean +- 1.96 SE (Miller 2024); SEs are",
    "clustered by task (naive: every run an independent draw); pass@k: some of k runs passes, pass^k: all k do",
)


def _delta(text: str) -> float:
    import argparse

    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: give a difference in pass rate, e.g. 0.1") from None
    if not 0 < x <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a difference in pass rate: give one in (0, 1], e.g. 0.1")
    return x


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "compare", help="two suites: pass-rate difference with 95%% intervals, pass@k, pass^k, power",
        description="Compare two suites recorded by `tttr suite`: per task and overall, the difference in "
                    "pass rate (A - B) with a 95% interval, paired by run where both suites used the same "
                    "seeds and start trees (`tttr suite --seed S`), else by task; the clustered standard "
                    "error beside the naive one; pass@k and pass^k for k up to the runs per task; action "
                    "agreement by condition (layer); and how many runs per task a difference of a given "
                    "size needs (power 0.8, alpha 0.05). A and B are each a suite database (its latest "
                    "suite) or a label or suite id in --db. " + " ".join(NOTES),
    )
    p.add_argument("a", metavar="SUITE_A", help="a suite database file, or a label or suite id in --db")
    p.add_argument("b", metavar="SUITE_B", help="likewise")
    p.add_argument("--db", default=DEFAULT_DB, help=f"database holding labelled suites (default {DEFAULT_DB})")
    p.add_argument("--delta", type=_delta, action="append",
                   help="a difference whose runs per task to report (repeatable; default 0.05, 0.1 and 0.2)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="also write the plots as a PNG (matplotlib)")
    p.add_argument("--plot-terminal", action="store_true", help="also draw the plots in the terminal (plotext)")
    p.set_defaults(func=cmd_compare)

    m = sub.add_parser(
        "merge", help="merge session databases into one (ids remapped, blobs stored once)",
        description="Copy every run of each SOURCE database into a new database: run ids are remapped "
                    "(parents and forks follow), events are copied as stored, blobs are stored once, "
                    "suites keep their ids and labels. Refused, with nothing written, when a source has "
                    "another schema version, two sources give one suite different labels, or the target "
                    "exists (unless --append).",
    )
    m.add_argument("sources", nargs="+", metavar="SOURCE.db", help="session databases to read")
    m.add_argument("--into", required=True, metavar="TARGET.db", help="the database to write")
    m.add_argument("--append", action="store_true", help="add to TARGET.db if it exists")
    m.set_defaults(func=cmd_merge)


def resolve(spec: str, db: str):
    """A `tttr compare` argument as a Side: a database file (its latest suite), else a label or
    suite id in `db`."""
    from tttr.app.commands.agent import _open_readonly
    from tttr.engine.replay.comparison import Side
    from tttr.engine.replay.suite import SuiteError, find_suite, suite_labels, suite_runs

    if Path(spec).is_file():
        path, key, where = spec, None, spec
    elif Path(db).is_file():
        path, key, where = db, spec, db
    else:
        raise SuiteError(f"{spec!r} is neither a suite database nor a label or suite id in --db {db!r} "
                         "(no such file): give a database file, or --db FILE")
    with _open_readonly(path) as store:
        suite_id = find_suite(store, key, where)
        return Side(spec, suite_id, suite_labels(store)[suite_id], tuple(suite_runs(store, suite_id)))


def cmd_compare(args) -> int:
    from tttr.engine.replay.comparison import DELTAS, compare
    from tttr.sessions.export import safe_json

    if args.plot:
        from tttr.app.commands.suite import _check_plot_path

        _check_plot_path(args.plot)
    a, b = resolve(args.a, args.db), resolve(args.b, args.db)
    c = compare(a, b, tuple(args.delta) if args.delta else DELTAS)
    if args.json:
        print(safe_json(c.to_json()))
    else:
        print(comparison_text(c))
    if args.plot or args.plot_terminal:
        from tttr.app import stats_plot
        from tttr.app.commands.suite import show_plots

        show_plots(args, c, stats_plot.write_compare_png, stats_plot.compare_terminal_plot)
    return 0


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in [head, *rows]]


def side_name(side) -> str:
    from tttr.sessions.safe_text import visible

    label = f", label {side.label}" if side.label else ""
    return visible(f"{side.name} (suite {side.suite_id}{label})", newlines=False)


def comparison_text(c) -> str:
    """The comparison as plain text (it goes into a README as it is)."""
    from tttr.app.commands.suite import _f
    from tttr.engine.replay.variance import CONDITIONS
    from tttr.sessions.safe_text import visible

    out = [f"A: {side_name(c.a)}", f"B: {side_name(c.b)}"]
    rows = []
    for t in c.tasks:
        rows.append((visible(t.task, newlines=False), f"{t.passed_a}/{t.runs_a}", f"{t.passed_b}/{t.runs_b}",
                     f"{_f(t.diff, True)} [{_f(t.interval.low, True)},{_f(t.interval.high, True)}]", str(t.run_pairs)))
    out += _table(("task", "A passed", "B passed", "A-B [95% CI]", "run pairs"), rows)
    best = c.best
    iv = best.interval
    se = f", SE {best.se:.3f}" if best.se is not None else ""
    out.append(f"overall A-B: {_f(best.mean, True)} [{_f(iv.low, True)},{_f(iv.high, True)}] ({best.how}, n={best.n}"
               f"{se}); unpaired: SE {c.unpaired.se:.3f} clustered, {c.naive_unpaired_se:.3f} naive")
    out.append(f"pass rate A {_f(c.mean_a.mean)} (SE {c.mean_a.se:.3f} clustered, {c.naive_se_a:.3f} naive), "
               f"B {_f(c.mean_b.mean)} (SE {c.mean_b.se:.3f} clustered, {c.naive_se_b:.3f} naive)")
    out.append("pass@k  A/B: " + "  ".join(f"k={k} {x:.2f}/{y:.2f}" for k, x, y in c.pass_at_k))
    out.append("pass^k  A/B: " + "  ".join(f"k={k} {x:.2f}/{y:.2f}" for k, x, y in c.pass_hat_k))
    agree = []
    for cond in CONDITIONS:
        fa = c.stats_a.overall.by_condition.get(cond)
        fb = c.stats_b.overall.by_condition.get(cond)
        agree.append(f"{cond} {_f(fa.agreement.fraction if fa else None)}/{_f(fb.agreement.fraction if fb else None)}")
    out.append("agreement A/B: " + "  ".join(agree))
    for p in c.power:
        if p.runs_per_task is not None:
            need = f"{p.runs_per_task} runs per task"
        elif p.within_var + p.between_var == 0:
            need = "an estimate these runs cannot give (no run-to-run variance seen: record more runs)"
        else:
            need = "more tasks (no number of runs is enough: the tasks differ too much)"
        out.append(f"power: a true difference of {p.delta:.2f} needs {need} with these {p.tasks} task(s)")
    if c.only_a or c.only_b:
        left = [f"only in A: {', '.join(c.only_a)}"] if c.only_a else []
        left += [f"only in B: {', '.join(c.only_b)}"] if c.only_b else []
        out.append(visible("left out: " + "; ".join(left), newlines=False))
    return "\n".join([*out, *NOTES])


def cmd_merge(args) -> int:
    from tttr.sessions.merge import merge

    res = merge(args.sources, args.into, append=args.append)
    print(f"merged {res.runs} run(s), {res.events} event(s) and {res.blobs_added} new blob(s) "
          f"({res.blobs_shared} already there) from {len(args.sources)} database(s) into {args.into}")
    return 0

