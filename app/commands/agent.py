"""`tttr record`, `tttr replay`, `tttr fork` and `tttr diff`."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping

from tttr.app.commands import args as argtypes
from tttr.app.commands.store import safe_json, shown
from tttr.kernels.mode import MODES

DEFAULT_DB = "tttr.db"


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "record", help="run the agent on a task, or your own program, and record it",
        usage="tttr record (--task NAME | [options] -- PROGRAM ARG...) [options]",
        description="Run the shell agent on a task from the suite (`tttr tasks` lists them) with the "
                    "embedded default model or --model, recording every value it could not have "
                    "predicted. Prints the run id, steps, actions and outcome. With `-- PROGRAM ARG...` "
                    "instead of --task, record your own program: it runs in the sandbox with "
                    "OPENAI_BASE_URL and OPENAI_API_KEY pointing at the model (chat completions, completions "
                    "and the Responses API; whatever model name it sends), so an unmodified program on the "
                    "openai client, LangChain's ChatOpenAI, the OpenAI Agents SDK or LiteLLM records as it "
                    "is; it is recorded as one run. `from tttr.recorders import sdk` records its tools and clock.",
    )
    p.add_argument("--task", help="task name (see `tttr tasks`)")
    p.add_argument("program", nargs="*", metavar="PROGRAM ARG", help="after --: a program to record instead of --task")
    p.add_argument("--tree", help="with a PROGRAM: its start tree, copied to /work (default: an empty one); the "
                                  "end tree is kept in the database (tttr files RUN), DIR is left as it was")
    p.add_argument("--in-place", action="store_true",
                   help="with --tree: run the program in DIR itself, which it then changes (default: in a copy)")
    p.add_argument("--check", metavar="CMD", help="with a PROGRAM: a shell command run on the end tree; exit 0 = passed "
                                                 "(default: none, no verdict)")
    p.add_argument("--timeout", type=_timeout,
                   help="with a PROGRAM: seconds before it is killed (default 600, at most 3600)")
    _model_args(p)
    p.add_argument("--seed", type=argtypes.seed, help="sampling and sandbox seed (default: random)")
    # The agent's sampling, kernels and step limit: None until given, so that a PROGRAM refuses them
    # (its calls sample as each request asks, under the invariant kernels); TASK_DEFAULTS otherwise.
    p.add_argument("--temperature", type=float, help="with --task: sampling temperature (default 0.7; 0 = greedy)")
    p.add_argument("--top-p", type=float, help="with --task: nucleus sampling (default 1.0)")
    p.add_argument("--top-k", type=argtypes.count, help="with --task: top-k sampling (default 0 = off)")
    p.add_argument("--kernels", choices=MODES,
                   help="with --task: kernel mode (default invariant: replays are the same arithmetic)")
    p.add_argument("--clock", help="virtual clock at the start, ISO, e.g. 2026-03-02T10:00:00 (default: the task's clock, else now)")
    p.add_argument("--max-steps", type=argtypes.steps, help="with --task: step limit (default 6)")
    _common(p)
    p.set_defaults(func=cmd_record)

    p = _with_program_after_dashes(sub, lambda: sub.add_parser(
        "replay", help="replay a run: faithful, or with one layer freed",
        description="Replay a recorded run. With nothing freed the replay is faithful: recorded "
                    "tokens, logits, clock values and tool results are taken as they are (no model "
                    "compute, no command runs). --free LAYER[,LAYER] computes those layers live. "
                    "Prints whether the decisions are identical and, if not, the first divergence. "
                    "The replay is stored as a child run. A recorded program replays against today's code "
                    "with --code DIR (and -- PROGRAM ARG... for another command line), sealed with --sealed.",
    ))
    p.add_argument("run", type=argtypes.run_id, help="run id (see `tttr runs DB`)")
    p.add_argument("--free", default="", metavar="LAYERS",
                   help="comma-separated layers to compute live: tensor, token, trace, e.g. token,trace "
                        "(default: none, a faithful replay)")
    p.add_argument("--seed", type=argtypes.seed, help="seed for a freed token layer (default: random)")
    p.add_argument("--code", metavar="DIR",
                   help="a recorded program only: lay the files of DIR (your program as it is now) over the "
                        "recorded start tree and replay against the recording (default: the recorded files)")
    p.add_argument("--sealed", action="store_true",
                   help="a recorded program only: nothing runs live (no model, no SDK tool); the first call the "
                        "recording cannot answer ends the replay with exit code 1 and the divergence")
    p.add_argument("program", nargs="*", metavar="PROGRAM ARG",  # filled from after -- (_with_program_after_dashes)
                   help="after --: a recorded program only, the command line to replay instead of the recorded one")
    _upstream_args(p)
    _model_args(p)
    _common(p)
    p.set_defaults(func=cmd_replay)

    p = _with_program_after_dashes(sub, lambda: sub.add_parser(
        "fork", help="change one recorded value and run on from there",
        description="Fork a run at one site with a new value: everything before the site comes from "
                    "the record, the rest runs live (values that do not depend on the change, such as "
                    "later clock readings and the RNG stream, stay pinned). Sites: STEP:clock "
                    "(ISO time or +/-seconds, +2h, -1d; setup:clock, the setup step's clock, moves the "
                    "whole run), STEP:tool (stdout text, exit=N, or JSON with "
                    "stdout/stderr/exit_code), STEP:token:POS (a token id or one token's text).",
    ))
    p.add_argument("run", type=argtypes.run_id, help="run id to fork")
    p.add_argument("--at", required=True, metavar="SITE", help="e.g. 2:clock, 1:tool, 0:token:3, setup:clock")
    p.add_argument("--set", required=True, dest="value", metavar="VALUE", help="the new value")
    p.add_argument("--code", metavar="DIR", help="an imported trace only: the folder holding the program after --")
    p.add_argument("program", nargs="*", metavar="PROGRAM ARG",  # filled from after -- (_with_program_after_dashes)
                   help="after --: an imported trace only, your program, forked against the trace (docs/traces.md)")
    _upstream_args(p)
    _model_args(p)
    _common(p)
    p.set_defaults(func=cmd_fork)

    p = sub.add_parser(
        "diff", help="compare two runs step by step",
        description="Align two runs step by step (actions aligned by edit distance), report the first "
                    "divergence per layer, and print both trajectories side by side.",
    )
    p.add_argument("run_a", type=argtypes.run_id, help="first run id (see `tttr runs DB`)")
    p.add_argument("run_b", type=argtypes.run_id, help="second run id")
    p.add_argument("--db", default=DEFAULT_DB, help=f"session database (default {DEFAULT_DB})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_diff)


def _with_program_after_dashes(sub, make):
    """The parser `make()` adds to `sub`, taking the words after `--` as its `program`: argparse
    fills a second positional (after RUN) only from the words next to the first."""
    import argparse

    class ProgramAfterDashes(sub._parser_class):
        def parse_known_args(self, args=None, namespace=None):
            args = list(args or [])
            words = args[args.index("--") + 1:] if "--" in args else []
            if "--" in args:
                args = args[:args.index("--")]
            ns, extra = super().parse_known_args(args, namespace)
            if words:
                ns.program = words
            return ns, extra

    assert issubclass(ProgramAfterDashes, argparse.ArgumentParser)
    was, sub._parser_class = sub._parser_class, ProgramAfterDashes
    try:
        return make()
    finally:
        sub._parser_class = was


def _timeout(text: str) -> float:
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= 3600):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds in (0, 3600]")
    return value


def _upstream_args(p) -> None:
    p.add_argument("--upstream", metavar="URL", help="an imported trace only: an OpenAI-compatible server for the "
                                                     "program's live model calls (default: the engine here)")
    p.add_argument("--upstream-key-env", metavar="NAME", help="with --upstream: the environment variable holding its key")


def _model_args(p) -> None:
    p.add_argument("--model", help="GGUF file or Hugging Face folder (default: TTTR_MODEL, then the embedded SmolLM2)")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="run agent commands without bubblewrap where the machine refuses namespaces (unsafe)")


def _common(p) -> None:
    p.add_argument("--db", default=DEFAULT_DB, help=f"session database (default {DEFAULT_DB})")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _progress(enabled: bool, header: str):
    """Progress on stderr; the header prints with the first report, so that input refused
    before any work starts leaves only the one error line."""
    if not enabled:
        return None
    started = []

    def report(done: int, total: int, message: str) -> None:
        if not started:
            started.append(True)
            print(header, file=sys.stderr, flush=True)
        from tttr.sessions.safe_text import visible

        print(f"  [{done}/{total}] {visible(message, newlines=False)}", file=sys.stderr, flush=True)  # the model's command

    return report


def _open_readonly(path: str):
    from tttr.sessions.store import Store

    return Store.open(path, create=False, readonly=True)


def _runtime(args, kernel_mode: str | None = None):
    from tttr.engine.replay.runtime import Runtime

    return Runtime(args.model, kernel_mode=kernel_mode or "invariant")


def _clock_arg(text: str):
    """--clock: an ISO date-time the virtual clock can show (one line, exit 2 otherwise)."""
    from datetime import datetime

    from tttr.engine.replay.runs import ReplayError, sandbox_clock

    try:
        clock = datetime.fromisoformat(text).replace(tzinfo=None)
    except ValueError:
        raise ReplayError(f"--clock {text!r} does not parse: give an ISO date-time like 2026-03-01T09:00:00") from None
    return sandbox_clock(clock, "--clock")


# `tttr record --task`'s options that a recorded program has no use for, and their defaults.
TASK_DEFAULTS = {"temperature": 0.7, "top_p": 1.0, "top_k": 0, "kernels": "invariant", "max_steps": 6}


def cmd_record(args) -> int:
    if bool(args.task) == bool(args.program):
        from tttr.sessions.errors import TTTRError

        raise TTTRError("give exactly one of --task NAME or -- PROGRAM ARG... "
                        "(e.g. tttr record --task write-line, or tttr record -- python3 agent.py)")
    if args.program:
        given = [f"--{name.replace('_', '-')}" for name in TASK_DEFAULTS if getattr(args, name) is not None]
        if given:
            from tttr.sessions.errors import TTTRError

            raise TTTRError(f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with --task, not with "
                            "-- PROGRAM ARG...: a program's model calls sample as each request asks, under the "
                            "invariant kernels, for as long as it runs (--timeout)")
        return cmd_record_program(args)
    for name in ("tree", "check", "timeout", "in_place"):
        if getattr(args, name) not in (None, False):
            from tttr.sessions.errors import TTTRError

            raise TTTRError(f"--{name.replace('_', '-')} goes with -- PROGRAM ARG..., not with --task")
    for name, value in TASK_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    from tttr.engine.kinds import AGENT, RecordRequest

    clock = _clock_arg(args.clock) if args.clock is not None else None  # '' is refused, not 'no clock'
    request = RecordRequest(task=args.task, model=args.model, seed=args.seed, clock=clock,
                            unsafe_no_sandbox=args.unsafe_no_sandbox, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, kernels=args.kernels, max_steps=args.max_steps)
    res = AGENT.record(args.db, AGENT.check_record(request),
                       _progress(not args.json, f"recording task {args.task} into {args.db} …"))
    _print_result(args, res, "recorded")
    return 0


def cmd_record_program(args) -> int:
    from tttr.app.commands.program_output import print_result
    from tttr.engine.kinds import PROGRAM, RecordRequest

    clock = _clock_arg(args.clock) if args.clock is not None else None

    def progress(text: str) -> None:
        if not args.json:
            print(f"tttr record: {text}", file=sys.stderr, flush=True)

    request = RecordRequest(argv=tuple(args.program), model=args.model, seed=args.seed, clock=clock,
                            unsafe_no_sandbox=args.unsafe_no_sandbox, tree=args.tree, check=args.check,
                            timeout_s=args.timeout or 600.0, in_place=args.in_place)
    res = PROGRAM.record(args.db, PROGRAM.check_record(request), progress)
    print_result(res, args.db, args.json)
    return 0


def cmd_replay(args) -> int:
    from tttr.engine.kinds import ReplayRequest, kind_of
    from tttr.engine.replay.policy import Policy

    request = ReplayRequest(Policy.parse(args.free), seed=args.seed, model=args.model, code=args.code,
                            unsafe_no_sandbox=args.unsafe_no_sandbox, argv=tuple(args.program), sealed=args.sealed,
                            upstream=args.upstream, upstream_key_env=args.upstream_key_env)
    with _open_readonly(args.db) as reader:  # checked before anything is written
        run = reader.run(args.run)
        kind = kind_of(run)
        plan = kind.check_replay(reader, run, request)
    res = kind.replay(args.db, plan, _reporter(args, kind, "replay",
                                               f"replaying run {args.run} ({request.policy.describe()}) …"))
    _show(args, kind, res, "replayed")
    return 1 if request.sealed and res.divergence is not None else 0


def cmd_fork(args) -> int:
    from tttr.engine.kinds import ForkRequest, kind_of

    request = ForkRequest(args.at, args.value, model=args.model, unsafe_no_sandbox=args.unsafe_no_sandbox,
                          argv=tuple(args.program), code=args.code, upstream=args.upstream,
                          upstream_key_env=args.upstream_key_env)
    with _open_readonly(args.db) as reader:  # the run, the site and the value, checked before anything is written
        run = reader.run(args.run)
        kind = kind_of(run)
        plan = kind.check_fork(reader, run, request)
    res = kind.fork(args.db, plan, _reporter(args, kind, "fork", f"forking run {args.run} at {args.at} …"))
    _show(args, kind, res, "forked")
    return 0


def _reporter(args, kind, verb: str, header: str):
    """How a verb's progress reaches stderr: a program's replay says what it does in lines of
    its own, the oracle's reports steps under a header printed with the first one."""
    if kind.runs_program:
        return None if args.json else (lambda text: print(f"tttr {verb}: {text}", file=sys.stderr, flush=True))
    return _progress(not args.json, header)


def _show(args, kind, res, verb: str) -> None:
    if kind.runs_program:
        from tttr.app.commands.program_output import print_fork, print_replay

        print_replay(res, args.json) if verb == "replayed" else print_fork(res, args.json)
    else:
        _print_result(args, res, verb)


def _verdict(outcome) -> str:
    if not isinstance(outcome, Mapping):  # an Outcome, or the recording's as JSON
        return "no outcome"
    verdict = {True: "passed", False: "failed"}.get(outcome.get("passed"), "no verdict")
    tree = outcome.get("tree")
    return f"{verdict} (tree {tree[:12]})" if isinstance(tree, str) else verdict


def _print_result(args, res, verb: str) -> None:
    from tttr.engine.replay.result import CallsResult

    if args.json:
        print(safe_json(res.to_json(), default=str))
        return
    from tttr.sessions.safe_text import visible

    def say(text: str) -> None:  # actions and values come from the model or the file
        print(visible(text, newlines=False))

    head = f"{verb} run {res.run_id}" + (f" (child of {res.parent})" if res.parent is not None else "")
    calls = isinstance(res, CallsResult)  # recorded API calls: one message per call, no task outcome
    if calls:
        say(f"{head}: {len(res.actions)} calls, status {res.status}")
        for i, text in enumerate(res.actions):
            say(f"  call {i}: {json.dumps(text, ensure_ascii=False)}")
    else:
        outcome = "passed" if res.passed else ("failed" if res.passed is False else res.status)
        say(f"{head}: {len(res.actions)} steps, outcome {outcome}, status {res.status}")
        reason = res.outcome.checker_output if res.passed is False else None
        if isinstance(reason, str) and reason.strip():  # why the checker failed it, in its words
            say(f"  checker: {reason.strip().splitlines()[0][:200]}")
        for i, action in enumerate(res.actions):
            say(f"  step {i}: {action}")
    if res.identical is not None:
        what = "tokens" if calls else "decisions"
        say(f"{what} identical to the recording" if res.identical else f"{what} differ from the recording")
    if res.same_outcome is False:
        say(("the same decisions led to a different end state" if res.identical else "the end state differs too")
            + f": {_verdict(res.extra.get('recorded_outcome'))} in the recording, {_verdict(res.outcome)} here")
    if res.divergence is not None:
        say(f"replay diverged at {res.divergence.describe()}")  # a token's text beside its id, as it was found
    for note in res.extra.get("notes", ()):
        say(note)
    if res.parent is not None and calls:
        say(f"  logits computed: {res.logits_computed}")
    elif res.parent is not None:
        say(f"  logits computed: {res.logits_computed}, commands run: {res.commands_run}")


def cmd_diff(args) -> int:
    from tttr.engine.replay.diff import diff_runs

    with _open_readonly(args.db) as store:  # a diff only reads
        d = diff_runs(store, args.run_a, args.run_b)
    if d.note:  # agent actions beside calls: every row differs, and this says why
        print(f"note: {d.note}", file=sys.stderr)
    if args.json:
        print(safe_json(d.to_json(), default=str))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    table = Table(title=f"run {args.run_a}  vs  run {args.run_b}", show_lines=False)
    table.add_column("step A", justify="right")
    table.add_column(f"run {args.run_a}", overflow="fold")
    table.add_column("step B", justify="right")
    table.add_column(f"run {args.run_b}", overflow="fold")
    for r in d.rows:
        style = "" if r.same else "bold red"
        table.add_row(shown(_s(r.a_step)), shown(r.a_action), shown(_s(r.b_step)), shown(r.b_action), style=style or None)
    console.print(table)
    if d.identical:
        console.print("the runs are identical at every compared site")
    for i, div in enumerate(d.by_cause()):  # the first cause first, then each other layer's first
        more = d.differing_sites.get(div.layer, 1) - 1
        tail = f"; {more} more differing site{'s' if more != 1 else ''} in the {div.layer} layer" if more else ""
        head = "first divergence" if i == 0 else f"then, in the {div.layer} layer"
        console.print(shown(f"{head}: {div.describe()}{tail}"))
    if d.prompt_change is not None:
        p = d.prompt_change
        console.print(shown(f"the prompt of step {p.step} differs at {p.what}:"))
        for run_id, value in ((args.run_a, p.a), (args.run_b, p.b)):
            console.print(shown(f"  run {run_id}: {json.dumps(value, ensure_ascii=False)[:2000]}"))
    return 0


def _s(v) -> str:
    return "" if v is None else str(v)
