"""`tttr triage` and `tttr bisect`: locate the layer, and the deltas, that make a run fail (issue 17)."""

from __future__ import annotations

import sys

from tttr.app.commands import args as argtypes
from tttr.app.commands.agent import _common, _model_args, _open_readonly
from tttr.app.commands.store import safe_json


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "triage", help="which layer makes BAD fail: replay it with each layer taken from GOOD",
        description="GOOD and BAD are two runs of the same task (or of one recorded program) where GOOD passed "
                    "and BAD failed (or, with --judge actions, took other actions). Replays BAD once per layer with that layer's "
                    "values taken from GOOD — tensor: its kernel mode; token: its seed and tokens where "
                    "the context matches; trace: its clock readings and tool results where the request "
                    "matches — and reports per layer whether the failure disappears, the verdict, and the "
                    "replays (stored runs). The layers' replays run side by side, batched through the engine, "
                    "under invariant kernels (each gets the tokens and logits it gets alone), one at a time under "
                    "fast ones; for recorded programs each replay is a program in a sandbox of its own.",
    )
    _pair_args(p)
    p.add_argument("--one-at-a-time", action="store_true",
                   help="replay the layers one after another instead of side by side")
    p.set_defaults(func=cmd_triage)

    p = sub.add_parser(
        "bisect", help="the smallest set of differences between GOOD and BAD that makes GOOD fail",
        description="Delta debugging (Zeller's ddmin) over the differences between two runs of one task "
                    "— clock readings, tool results, sampled tokens, seed, kernel mode — across layers: "
                    "each test replays GOOD with a subset of BAD's values applied and judges it. Prints "
                    "the minimal failure-inducing set with layers and sites, the replays used, and each "
                    "tested subset's stored run. Progress per round on stderr; Ctrl-C keeps the tested "
                    "runs and prints the best set so far. The independent tests of a round run batched "
                    "(side by side through the engine) under invariant kernels, one at a time under fast ones; "
                    "for recorded programs each test is a fork of the program with several values changed, in a "
                    "sandbox of its own, and the programs of a round run at once, their model calls batched.",
    )
    _pair_args(p)
    p.add_argument("--max-replays", type=argtypes.positive, default=50,
                   help="stop after this many replays with the best set so far (default 50)")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="run every test alone instead of batching a round's tests (fewer replays, more time)")
    p.set_defaults(func=cmd_bisect)


def _pair_args(p) -> None:
    p.add_argument("good", type=argtypes.run_id, metavar="GOOD", help="the run that passed")
    p.add_argument("bad", type=argtypes.run_id, metavar="BAD", help="the run that failed")
    p.add_argument("--judge", choices=("outcome", "actions"), default="outcome",
                   help="what failing means: the task's checker fails (default), or the actions differ from GOOD's")
    p.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run each replay as a Ray task, merged here as it returns: on a local Ray instance, or the "
                        "cluster at ADDRESS (pip install 'tttr[ray]'); the same tests and verdicts as without")
    _model_args(p)
    _common(p)  # --db FILE (default tttr.db) and --json, as tttr diff takes them


def _planned(args, verb: str):
    """(kind, plan): the runs are two runs of one kind experiments take, of one task or
    program, that differ, GOOD passes on a faithful replay and BAD fails; checked on a
    read-only connection, so refused input writes nothing."""
    from tttr.engine.kinds import ExperimentRequest, pair_kind

    if args.ray is not None:
        from tttr.engine.replay.ray_suite import _ray, check_address

        check_address(args.ray or None)  # an address that does not answer: one line, before anything is replayed
        _ray()
    request = ExperimentRequest(args.good, args.bad, judge=args.judge, model=args.model,
                                batch=not args.one_at_a_time, max_replays=getattr(args, "max_replays", 50),
                                unsafe_no_sandbox=args.unsafe_no_sandbox, ray=args.ray)
    with _open_readonly(args.db) as reader:
        kind = pair_kind(reader.run(args.good), reader.run(args.bad), verb)
        return kind, kind.check_experiment(reader, args.db, verb, request)


def _say(text: str) -> None:
    from tttr.sessions.safe_text import visible

    print(visible(text, newlines=False))  # sites and values come from the file


def _err(args, text: str) -> None:
    if not args.json:
        from tttr.sessions.safe_text import visible

        print(visible(text, newlines=False), file=sys.stderr, flush=True)


def _outcome(trial) -> str:
    verdict = {True: "passed", False: "failed"}.get(trial.passed, trial.extra.get("status", "no outcome"))
    return f"run {trial.run_id} (checker {verdict})"


def _fixed(args, fixed: bool | None) -> str:
    if fixed is None:
        return "stopped before its end: no verdict"
    if args.judge == "actions":
        return "its actions now match GOOD's" if fixed else "its actions still differ from GOOD's"
    return "the failure disappears" if fixed else "still fails"


def cmd_triage(args) -> int:
    kind, plan = _planned(args, "triage")
    if kind.runs_program:
        _err(args, f"triage: replaying program run {args.bad} with each layer taken from run {args.good}"
                   + (", one replay at a time …" if args.one_at_a_time else " …"))
    else:
        _err(args, f"triage: replaying run {args.bad} with each layer taken from run {args.good} …")
    return _print_triage(args, kind.triage(args.db, plan, on_layer=_on_layer(args)))


def _on_layer(args):
    def on_layer(r) -> None:
        _err(args, f"  {r.layer}: " + ("no differences, not replayed" if r.trial is None
                                       else f"{_outcome(r.trial)}: {_fixed(args, r.fixed)}"))
    return on_layer


def _print_triage(args, res) -> int:
    if args.json:
        print(safe_json(res.to_json(), default=str))
        return 0
    _say(f"triage: BAD run {args.bad} against GOOD run {args.good} (judge: {args.judge})")
    for r in res.layers:
        if r.trial is None:
            _say(f"  {r.layer:<6} no differences: not replayed")
            continue
        sites = ", ".join(d.site for d in r.deltas[:6]) + (" …" if len(r.deltas) > 6 else "")
        _say(f"  {r.layer:<6} {len(r.deltas)} delta(s) from GOOD ({sites}) → {_outcome(r.trial)}: "
             + _fixed(args, r.fixed))
    _say(f"verdict: {res.verdict()}")
    runs = [str(r.trial.run_id) for r in res.layers if r.trial is not None]
    if runs:
        _say(f"replays: runs {', '.join(runs)} ({res.batch_note}); tttr diff {args.bad} RUN --db {args.db} "
             f"compares one, tttr open {args.db} shows them")
    return 0


def cmd_bisect(args) -> int:
    try:
        return _bisect(args)
    except KeyboardInterrupt:  # before BAD's whole set was seen to fail on GOOD: ddmin has no set yet
        from tttr.sessions.safe_text import visible

        print(visible(f"bisect: interrupted before BAD run {args.bad}'s differences were seen to make GOOD run "
                      f"{args.good} fail, so there is no set yet; any replays it started are kept as incomplete "
                      f"runs (tttr runs --db {args.db})", newlines=False), file=sys.stderr)
        return 130


def _bisect(args) -> int:
    on_round, on_trial = _bisect_progress(args)
    kind, plan = _planned(args, "bisect")
    if kind.runs_program:
        _err(args, f"bisect: program run {args.good} with subsets of run {args.bad}'s differences"
                   + (", one replay at a time …" if args.one_at_a_time else " …"))
    else:
        _err(args, f"bisect: GOOD run {args.good} with subsets of BAD run {args.bad}'s differences …")
    return _print_bisect(args, kind.bisect(args.db, plan, on_round=on_round, on_trial=on_trial))


def _bisect_progress(args):
    from tttr.engine.replay.deltas import counted

    def on_round(rnd, n, current, tests) -> None:
        _err(args, f"  round {rnd}: {counted(len(current))} in {min(n, len(current))} parts, {tests + 1} replays so far")

    def on_trial(trial) -> None:
        _err(args, f"    tested {len(trial.deltas)} delta(s) → {_outcome(trial)}: "
                   + ("fails" if trial.failed else "does not fail") + f" by --judge {args.judge}")

    return on_round, on_trial


def _print_bisect(args, res) -> int:
    from tttr.engine.replay.deltas import counted

    if args.json:
        print(safe_json(res.to_json(), default=str))
        return 0
    r = res.result
    _say(f"bisect: GOOD run {args.good}, BAD run {args.bad} (judge: {args.judge}): {counted(len(res.deltas))}")
    head = {None: "minimal failure-inducing set", "budget": "best set so far (--max-replays reached)",
            "interrupted": "best set so far (interrupted)"}[r.stopped]
    _say(f"{head}: {len(r.items)} delta(s), layer(s) {', '.join(sorted({d.layer for d in r.items}))}")
    for d in r.items:
        _say(f"  {d.describe()}")
    _say(f"replays used: {res.replays} ({res.batch_note}); tested runs: "
         + ", ".join(str(t.run_id) for t in res.trials))
    return 0
