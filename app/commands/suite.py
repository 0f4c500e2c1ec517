"""`tttr suite` and `tttr stats`: record runs under four pinning conditions and decompose
their variance by layer (issue 17). The work is `tttr.engine.replay.suite`; this parses,
prints and plots."""

from __future__ import annotations

import sys
import threading

from pathlib import Path

from tttr.app.commands import args as argtypes
from tttr.app.commands.agent import DEFAULT_DB

RULE_LINES = (
    "agreement: fraction of run pairs (same task and condition) with the same sequence of state-modifying",
    "actions (commands that changed the sandbox's files); 'removed': how much of the free condition's",
    "disagreement disappears with that layer pinned; residual: disagreement with every layer pinned (must be 0)",
)


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "suite", help="record N runs per task under four pinning conditions (variance by layer)",
        description="Record N runs per task in each of four conditions: free (a fresh seed and the "
                    "machine's clock: today's practice), token-pinned (one seed, the trace live), "
                    "trace-pinned (one clock and start tree, recorded tool results; a fresh seed per "
                    "run) and pinned (everything pinned: must agree 100%). The pinned conditions are "
                    "replays of each task's first free run. Runs go through the engine side by side "
                    "(--batch at a time, sharing its batches: the kernels are batch-invariant). "
                    "Progress on stderr; Ctrl-C keeps the finished runs and ends the ones in flight at once, marked "
                    "incomplete (exit 130). Read them with `tttr stats`.",
    )
    p.add_argument("--runs", type=argtypes.bounded_int(2, 1000, "a run count"),
                   help="runs per task and condition (at least 2: agreement compares pairs); required unless --resume")
    p.add_argument("--resume", metavar="SUITE_ID",
                   help="finish an interrupted suite of --db: run only its runs that are missing, with its own "
                        "tasks, runs, temperature and step limit (other settings are ignored)")
    p.add_argument("--tasks", help="comma-separated task names (default: every task, see `tttr tasks`, "
                                   "or every task of --tasks-dir)")
    p.add_argument("--tasks-dir", action="append", metavar="DIR",
                   help="your own tasks: a task folder or a folder of them (docs/suites.md); repeatable")
    p.add_argument("--label", help="a name for this suite, for `tttr compare` (default: none)")
    p.add_argument("--seed", type=argtypes.seed,
                   help="derive the free runs' seeds from this one (default: fresh seeds); two suites given the "
                        "same seed are compared run by run")
    p.add_argument("--model", help="GGUF file or Hugging Face folder (default: TTTR_MODEL, then the embedded SmolLM2)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7; must be > 0)")
    p.add_argument("--max-steps", type=argtypes.steps, default=6, help="step limit per run (default 6)")
    p.add_argument("--batch", type=argtypes.bounded_int(1, 64, "a batch size"), default=8,
                   help="runs in flight at once, sharing the engine's batches (default 8)")
    p.add_argument("--db", default=DEFAULT_DB, help=f"session database (default {DEFAULT_DB})")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="run agent commands without bubblewrap where the machine refuses namespaces (unsafe)")
    p.add_argument("--clock", help="the free runs' start clock, ISO (default: the machine's, today's practice); "
                                   "with --seed, two suites start from the same trees and pair run by run")
    p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run the suite's tasks as Ray tasks, each worker into a database of its own, merged here "
                        "as they finish: on a local Ray instance, or the cluster at ADDRESS (pip install 'tttr[ray]')")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="a program's time limit per run, seconds (default 600; with -- PROGRAM)")
    p.add_argument("program", nargs="*", metavar="PROGRAM ARG",
                   help="after --: your agent program, recorded once per task and run like `tttr record -- PROGRAM` "
                        "(docs/suites.md); default: the built-in agent")
    p.set_defaults(func=cmd_suite)

    p = sub.add_parser(
        "stats", help="pass rates, action agreement and its decomposition by layer for a suite",
        description="Read the runs of a suite recorded by `tttr suite`: per task and overall, the pass "
                    "rate with a 95% Wilson interval, action agreement per condition, and how much of "
                    "the free condition's disagreement disappears when each layer is pinned. "
                    + " ".join(RULE_LINES),
    )
    p.add_argument("--db", default=DEFAULT_DB, help=f"session database (default {DEFAULT_DB})")
    p.add_argument("--suite", help="suite id (default: the latest in the database)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", metavar="FILE.png", help="also write the plots as a PNG (matplotlib)")
    p.add_argument("--plot-terminal", action="store_true", help="also draw the plots in the terminal (plotext)")
    p.set_defaults(func=cmd_stats)


def _tasks(text: str | None, dirs: list[str] | None = None) -> list[str]:
    from tttr.recorders.tasks import list_tasks, load_task, use_task_dirs

    own = [t.name for t in use_task_dirs(dirs)] if dirs else None  # checked, and on the search path
    if text is None:
        return own if own is not None else [t.name for t in list_tasks()]
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        from tttr.sessions.errors import TTTRError

        raise TTTRError(f"--tasks {text!r} names no task: give comma-separated names (see `tttr tasks`)")
    for n in names:
        load_task(n)  # an unknown name: one line, before anything is written
    return list(dict.fromkeys(names))


def cmd_suite(args) -> int:
    from tttr.app.commands.agent import _clock_arg, _runtime
    from tttr.engine.inference.sampler import SamplingParams
    from tttr.engine.replay.runs import check_machine
    from tttr.engine.replay.suite import new_suite_id, run_suite
    from tttr.engine.replay.variance import CONDITIONS
    from tttr.sessions.errors import TTTRError
    from tttr.sessions.safe_text import visible

    if args.resume is not None:
        _resume_settings(args)
    elif args.runs is None:
        raise TTTRError("give --runs N (runs per task and condition), or --resume SUITE_ID to finish a suite")
    if not args.temperature > 0:
        raise TTTRError(f"--temperature {args.temperature} leaves nothing to vary: give a temperature > 0")
    SamplingParams(temperature=args.temperature, seed=0)
    tasks = _tasks(args.tasks, args.tasks_dir)
    args.clock = _clock_arg(args.clock) if args.clock else None
    if args.resume is None and args.label:
        args.resume = _same_label(args, tasks)  # the same command again finishes the suite it began
    if args.program and args.ray is None:
        return _program_suite(args, tasks)
    if args.ray is not None:
        return _ray_suite(args, tasks)
    runtime = _runtime(args, "invariant")
    check_machine(runtime, args.unsafe_no_sandbox)
    suite_id = args.resume or new_suite_id()
    total = len(tasks) * args.runs * len(CONDITIONS)
    print(f"suite {suite_id}: {len(tasks)} task(s) x {args.runs} runs x {len(CONDITIONS)} conditions = {total} runs "
          f"into {args.db}; up to {args.batch} at a time through one engine (batch-invariant kernels)"
          + ("; resuming: the runs it holds complete are not run again" if args.resume else ""),
          file=sys.stderr, flush=True)

    def progress(f) -> None:
        what = f"[{f.done}/{f.total}] {f.task} {f.condition} #{f.index}"
        if f.error is not None:
            line = f"{what}: failed: {f.error}"
        else:
            r = f.run
            verdict = r.status if r.status != "complete" else ("passed" if r.passed else "failed")
            line = f"{what}: run {r.run_id} {verdict}, {len(r.actions)} state-modifying action(s)"
        print(visible(line, newlines=False), file=sys.stderr, flush=True)

    cancel = threading.Event()
    try:
        _, runs = run_suite(args.db, tasks, args.runs, runtime=runtime, temperature=args.temperature,
                            max_steps=args.max_steps, batch=args.batch, unsafe_no_sandbox=args.unsafe_no_sandbox,
                            suite_id=suite_id, label=args.label, resume=args.resume is not None,
                            task_dirs=args.tasks_dir, seed=args.seed, clock=args.clock, progress=progress,
                            cancel=cancel)
    except KeyboardInterrupt:
        cancel.set()
        print(f"tttr suite: interrupted; the finished runs are kept in {args.db}, the ones in flight are "
              f"marked incomplete (tttr stats --db {args.db} --suite {suite_id})", file=sys.stderr)
        return 130
    finally:
        runtime.close()
    complete = sum(r.status == "complete" for r in runs)
    print(f"suite {suite_id}: {complete} of {total} runs complete in {args.db}"
          + (" (counting only this session's)" if args.resume else "")
          + f"; read them with: tttr stats --db {args.db}" + (f" --suite {suite_id}" if args.resume else ""))
    return 0


def _progress_line(f) -> str:
    from tttr.sessions.safe_text import visible

    what = f"[{f.done}/{f.total}] {f.task} {f.condition} #{f.index}"
    if f.retry is not None:
        line = f"{what}: {f.retry}"
    elif f.error is not None:
        line = f"{what}: failed: {f.error}"
    elif f.run is None:
        line = f"{what}: not stored"
    else:
        r = f.run
        verdict = r.status if r.status != "complete" else ("passed" if r.passed else "failed")
        calls = f", {len(r.calls)} model call(s)" if r.calls is not None else ""
        line = f"{what}: run {r.run_id} {verdict}, {len(r.actions)} state-modifying action(s){calls}"
    return visible(line, newlines=False)


def _ray_suite(args, tasks: list[str]) -> int:
    """`tttr suite ... --ray [ADDRESS]`: the suite's tasks as Ray tasks (engine/replay/ray_suite.py)."""
    from tttr.engine.replay.ray_suite import check_address, run_suite_on_ray
    from tttr.engine.replay.suite import new_suite_id

    check_address(args.ray or None)  # before anything is written
    suite_id = args.resume or new_suite_id()
    conditions = 4  # a program's too (engine/replay/program_suite.py)
    total = len(tasks) * args.runs * conditions
    print(f"suite {suite_id}: {len(tasks)} task(s) x {args.runs} runs x {conditions} conditions = {total} runs into {args.db}, "
          f"one Ray task per suite task on {args.ray or 'a local Ray instance'}", file=sys.stderr, flush=True)
    try:
        _, runs = run_suite_on_ray(
            args.db, tasks, args.runs, model=args.model, temperature=args.temperature, max_steps=args.max_steps,
            batch=args.batch, unsafe_no_sandbox=args.unsafe_no_sandbox, suite_id=suite_id, label=args.label,
            resume=args.resume is not None, task_dirs=args.tasks_dir, seed=args.seed, clock=args.clock,
            address=args.ray or None, program=args.program or None, timeout_s=args.timeout,
            progress=lambda f: print(_progress_line(f), file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        print(f"tttr suite: interrupted; the tasks merged so far are kept in {args.db}; the others were cancelled "
              f"(tttr suite --resume {suite_id} --db {args.db} --ray finishes them)", file=sys.stderr)
        return 130
    return _finished(args.db, suite_id, total, runs)


def _finished(db, suite_id: str, total: int, runs) -> int:
    """The last line of a Ray or program suite: how many of its runs completed, and how to read them."""
    complete = sum(r.status == "complete" for r in runs)
    print(f"suite {suite_id}: {complete} of {total} runs complete in {db}; "
          f"read them with: tttr stats --db {db} --suite {suite_id}")
    return 0


def _program_suite(args, tasks: list[str]) -> int:
    """`tttr suite ... -- PROGRAM ARG...`: the user's program as the agent."""
    from tttr.engine.replay.program_suite import PROGRAM_CONDITIONS, run_program_suite
    from tttr.engine.replay.suite import new_suite_id
    from tttr.recorders.program import HostPython, check_program
    from tttr.sessions.errors import TTTRError

    if not 0 < args.timeout <= 86400:
        raise TTTRError(f"--timeout {args.timeout}: give seconds in (0, 86400]")
    if "/" not in args.program[0]:  # a command on PATH: there now, or refused before anything is written
        check_program(args.program, Path.cwd(), HostPython.current())
    elif not Path(args.program[0]).exists():
        raise TTTRError(f"program {args.program[0]!r} not found: give a command on PATH or a file that exists")
    suite_id = args.resume or new_suite_id()
    total = len(tasks) * args.runs * len(PROGRAM_CONDITIONS)
    print(f"suite {suite_id}: {len(tasks)} task(s) x {args.runs} runs x {len(PROGRAM_CONDITIONS)} conditions "
          f"({', '.join(PROGRAM_CONDITIONS)}) = {total} recordings of {' '.join(args.program)} into {args.db}",
          file=sys.stderr, flush=True)
    try:
        _, runs = run_program_suite(
            args.db, tasks, args.runs, args.program, model=args.model, timeout_s=args.timeout,
            unsafe_no_sandbox=args.unsafe_no_sandbox, suite_id=suite_id, label=args.label,
            resume=args.resume is not None, task_dirs=args.tasks_dir, seed=args.seed, clock=args.clock,
            progress=lambda f: print(_progress_line(f), file=sys.stderr, flush=True))
    except KeyboardInterrupt:
        print(f"tttr suite: interrupted; the finished runs are kept in {args.db}, the one in flight is marked "
              f"incomplete (tttr suite --resume {suite_id} --db {args.db} -- ... finishes it)", file=sys.stderr)
        return 130
    return _finished(args.db, suite_id, total, runs)


def _same_label(args, tasks: list[str]) -> str | None:
    """The suite of --db that --label names, when its settings are this command's and it lacks
    runs (a re-run resumes it); None when no suite has the label. A label on a suite with other
    settings, or on a finished one, is refused: `tttr compare` needs a label to name one suite."""
    from pathlib import Path

    from tttr.app.commands.agent import _open_readonly
    from tttr.engine.replay.suite import SuiteError, read_suite, suite_labels

    if not Path(args.db).is_file():
        return None
    with _open_readonly(args.db) as store:
        named = [i for i, label in suite_labels(store).items() if label == args.label]
        if not named:
            return None
        before = read_suite(store, named[-1])
    s = before.settings
    mine = {"tasks": list(tasks), "runs": args.runs, "temperature": args.temperature, "max_steps": args.max_steps,
            "seed": args.seed, "clock": args.clock.isoformat() if args.clock else None,
            "program": list(args.program) if args.program else None}
    theirs = {k: s.get(k) for k in mine}
    if args.program:  # a program's suite records no temperature or step limit of its own
        mine.update(temperature=None, max_steps=None)
        theirs.update(temperature=None, max_steps=None)
    if theirs != mine:
        differ = ", ".join(k for k in mine if theirs[k] != mine[k])
        raise SuiteError(f"--label {args.label!r} names suite {named[-1]} of {args.db}, recorded with other settings "
                         f"({differ}): give another label, or --resume {named[-1]} to finish that one")
    conditions = 4
    if len(before.done) >= len(tasks) * args.runs * conditions:
        raise SuiteError(f"--label {args.label!r} names suite {named[-1]} of {args.db}, which is complete: "
                         "give another label for a new suite")
    print(f"tttr suite: resuming suite {named[-1]} (label {args.label}): the same settings, "
          f"{len(before.done)} run(s) already complete", file=sys.stderr)
    return named[-1]


def _resume_settings(args) -> None:
    """--resume ID: the suite's own settings, read from its runs in --db, replace the flags'."""
    from pathlib import Path

    from tttr.app.commands.agent import _open_readonly
    from tttr.engine.replay.suite import SuiteError, read_suite

    if not Path(args.db).is_file():
        raise SuiteError(f"--resume {args.resume}: no database {args.db!r}: give the suite's --db")
    with _open_readonly(args.db) as store:
        before = read_suite(store, args.resume)
    s = before.settings
    if not s or not isinstance(s.get("tasks"), list) or not isinstance(s.get("runs"), int):
        raise SuiteError(f"suite {args.resume} does not record its settings (it predates --resume): "
                         "run a new suite instead")
    args.tasks = ",".join(str(t) for t in s["tasks"])
    args.runs = s["runs"]
    args.temperature = float(s.get("temperature", args.temperature))
    args.max_steps = int(s.get("max_steps", args.max_steps))
    args.label = s.get("label") if isinstance(s.get("label"), str) else None
    args.seed = s.get("seed") if isinstance(s.get("seed"), int) else None
    args.clock = s.get("clock") if isinstance(s.get("clock"), str) else None
    program = s.get("program")
    if isinstance(program, list) and program and all(isinstance(a, str) for a in program):
        args.program = program
    dirs = s.get("task_dirs")
    args.tasks_dir = [str(d) for d in dirs] if isinstance(dirs, list) and dirs else None


def _check_plot_path(path: str) -> None:
    from pathlib import Path

    from tttr.sessions.errors import TTTRError

    p = Path(path)
    if p.suffix.lower() != ".png":
        raise TTTRError(f"--plot {path!r}: give a file name ending in .png")
    if not p.parent.resolve().is_dir():
        raise TTTRError(f"--plot {path!r}: the folder {str(p.parent)!r} does not exist")


def cmd_stats(args) -> int:
    from tttr.app.commands.agent import _open_readonly
    from tttr.engine.replay.suite import suite_stats
    from tttr.sessions.export import safe_json

    if args.plot:
        _check_plot_path(args.plot)  # before anything is read or written
    with _open_readonly(args.db) as store:
        stats = suite_stats(store, args.suite)
    if args.json:
        print(safe_json(stats.to_json()))
    else:
        print(stats_table(stats))
    if not all(t.decomposition.residual_ok for t in [*stats.tasks, stats.overall]):
        print("tttr stats: RESIDUAL NOT ZERO: runs with every layer pinned disagree; those replays are not "
              "controlled experiments on this machine (see the 'pinned' column)", file=sys.stderr)
    from tttr.app import stats_plot

    show_plots(args, stats, stats_plot.write_png, stats_plot.terminal_plot)
    return 0


def show_plots(args, result, write_png, terminal_plot) -> None:
    """`--plot FILE` and `--plot-terminal` of `tttr stats` and `tttr compare`: the PNG written
    (said so unless --json), the terminal plot on stdout (stderr beside --json)."""
    if args.plot:
        write_png(result, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    if args.plot_terminal:
        print(terminal_plot(result), file=sys.stderr if args.json else sys.stdout)


def _f(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def stats_table(stats) -> str:
    """A plain-text table (it goes into a README as it is): one row per task and overall."""
    from tttr.sessions.safe_text import visible

    head = ("task", "runs", "pass free [95% CI]", "agree: free", "token-pin", "trace-pin", "pinned",
            "removed: token", "trace", "residual")
    rows = []
    for t in [*stats.tasks, stats.overall]:
        free = t.by_condition.get("free")
        iv = free.interval if free else None
        cell = f"{_f(free.pass_rate)} [{_f(iv.low)},{_f(iv.high)}]" if iv else "-"
        agree = [_f(t.by_condition[c].agreement.fraction) if c in t.by_condition else "-"
                 for c in ("free", "token-pinned", "trace-pinned", "pinned")]
        runs = "/".join(str(t.by_condition[c].runs) if c in t.by_condition else "0"
                        for c in ("free", "token-pinned", "trace-pinned", "pinned"))
        d = t.decomposition
        residual = _f(d.residual) + ("" if d.residual_ok else " !")
        rows.append((visible(t.task, newlines=False), runs, cell, *agree, _f(d.removed_by("token"), True),
                     _f(d.removed_by("trace"), True), residual))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [head, *rows]]
    out = [visible(f"suite {stats.suite_id} (runs per condition: free/token-pinned/trace-pinned/pinned)", newlines=False),
           *lines, *RULE_LINES]
    program = [t for t in [*stats.tasks, stats.overall] if any(o.calls.pairs for o in t.by_condition.values())]
    if program:  # a program's suite: agreement on its model calls and on its checked outcome too
        out.append("a program's runs also agree (or not) on their model calls (answers, in order) and checked "
                   "outcome, per condition:")
        for t in program:
            cells = [f"{c} calls {_f(o.calls.fraction)} outcome {_f(o.verdicts.fraction)}"
                     for c, o in t.by_condition.items()]
            out.append(visible(f"  {t.task}: " + "; ".join(cells), newlines=False))
    if stats.left_out:
        out.append(f"{stats.left_out} incomplete run(s) left out")
    return "\n".join(out)
