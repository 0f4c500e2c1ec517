"""`tttr sandbox exec|probe`, `tttr tasks` and `tttr task check`."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from tttr.app.commands import args as argtypes

EXEC_DESCRIPTION = """\
Run one command in the sandbox exactly as the agent's tool call would and print
its stdout, stderr, exit code, duration, clock and the mechanisms that were
active. Exits with the command's status (124 when the timeout killed it), like
`timeout` and `docker exec`.

After --, several arguments are one command and its arguments, as with bwrap,
docker run and faketime (quoted with shlex.join into the shell line that bash
runs); a single argument is a shell line, as the agent's commands are.

examples:
  tttr sandbox exec -- python3 -c 'print(1)'
  tttr sandbox exec --clock 2026-03-02T10:00:00 -- 'date; ls -l'"""


def register(sub, bench_sub) -> None:
    p = sub.add_parser(
        "sandbox", help="run one command the way the agent would; show what the sandbox allows",
        description="The trace layer's sandbox: bubblewrap namespaces, a virtual clock (libfaketime), "
                    "seeded randomness, a pinned environment and resource limits. A command cannot change "
                    "the host outside its tree: no capabilities, read-only /proc/sys, a seccomp filter, and, "
                    "when TTTR runs as root, an unprivileged host uid ($TTTR_SANDBOX_UID, default 100000) "
                    "to which the tree is handed before each command.",
    )
    ssub = p.add_subparsers(dest="sandbox_command", metavar="ACTION")
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])

    e = ssub.add_parser(
        "exec", help="run COMMAND in the sandbox and print what the agent would see",
        description=EXEC_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] -- COMMAND [ARG ...]",
    )
    e.add_argument("--clock", help="virtual clock, ISO (default: now, UTC)")
    e.add_argument("--seed", type=argtypes.seed, default=0, help="run seed for the sandbox's randomness (default 0)")
    e.add_argument("--step", type=argtypes.sandbox_step, default=0, help="agent step: randomness depends on (seed, step) (default 0)")
    e.add_argument("--tree", help="directory mounted read-write at /work (default: a fresh empty one); "
                                  "as root, its files are the sandbox's uid's while the command runs "
                                  "and the directory owner's after")
    e.add_argument("--timeout", type=float, default=30.0,
                   help="seconds before the command is killed (default 30, at most 3600)")
    e.add_argument("--tree-mb", type=int, default=1024,
                   help="size quota of the tree; the command is stopped past it (default 1024)")
    e.add_argument("--tmp-mb", type=int, default=256, help="size of the sandbox's /tmp and /dev/shm (default 256)")
    e.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="where bubblewrap or namespaces are refused, run the command unconfined (unsafe)")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("cmd", nargs="+", metavar="COMMAND",
                   help="after --: a command and its arguments (python3 -c 'print(1)'), "
                        "or one shell line as a single argument ('date; ls -l')")
    e.set_defaults(func=cmd_exec)

    pr = ssub.add_parser("probe", help="what this machine allows the sandbox to use",
                         description="Detect bubblewrap, namespaces, libfaketime, the randomness shim "
                                     "and the process limit, and print one line (or JSON).")
    pr.add_argument("--json", action="store_true", help="print one JSON object")
    pr.set_defaults(func=cmd_probe)

    t = sub.add_parser("tasks", help="list the task suite",
                       description="List the tasks: name, difficulty, tags, default clock and instruction.")
    t.add_argument("--json", action="store_true", help="print a JSON list")
    t.set_defaults(func=cmd_tasks)

    t = sub.add_parser("task", help="check tasks: solution passes, doing nothing fails",
                       description="Task maintenance.")
    tsub = t.add_subparsers(dest="task_command", metavar="ACTION")
    t.set_defaults(func=lambda args: (t.print_help(sys.stderr), 2)[1])
    c = tsub.add_parser(
        "check", help="setup + reference solution + checker must pass; setup + nothing must fail",
        description="For each task, in the sandbox and a fresh tree each time: setup, the reference "
                    "solution, then the checker (must pass); and setup then the checker (must fail).",
    )
    c.add_argument("name", nargs="?", help="task name (see `tttr tasks`) or a task folder of your own (docs/suites.md)")
    c.add_argument("--all", action="store_true", help="check every task")
    c.add_argument("--seed", type=argtypes.seed, default=0, help="run seed for the sandbox's randomness (default 0)")
    c.add_argument("--clock", help="virtual clock for every task, ISO, e.g. 2026-03-02T10:00:00 "
                                    "(default: each task's own clock)")
    c.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="where the sandbox is refused, run the scripts unconfined (unsafe)")
    c.add_argument("--json", action="store_true", help="print a JSON list of results")
    c.set_defaults(func=cmd_task_check)


def cmd_exec(args) -> int:
    import os
    import shutil
    import tempfile
    from datetime import datetime, timezone

    from tttr.recorders.clock import parse_clock
    from tttr.recorders.limits import Limits
    from tttr.recorders.sandbox import Executor
    from tttr.recorders.treeown import hand_over

    clock = parse_clock(args.clock) if args.clock is not None else datetime.now(timezone.utc).replace(tzinfo=None)
    command = shell_line(args.cmd)
    limits = Limits(timeout_s=args.timeout, tree_mb=args.tree_mb, tmp_mb=args.tmp_mb)  # refused before any file
    tmp = owner = None
    tree = args.tree
    if tree is None:
        tmp = tempfile.mkdtemp(prefix="tttr-sandbox-")
        tree = tmp
    try:
        with Executor(tree, seed=args.seed, unsafe_no_sandbox=args.unsafe_no_sandbox,
                      limits=limits) as ex:
            if args.tree is not None and ex.sandboxed:
                owner = os.stat(ex.tree)
            res = ex.run(command, clock, step=args.step)
    finally:
        if owner is not None:  # as root the sandbox's uid owned it while the command ran
            hand_over(str(ex.tree), owner.st_uid, owner.st_gid)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(res.to_json(), indent=2))
        return res.exit_code
    print(f"$ {command}")
    print(f"--- stdout ({res.stdout_size} bytes{', truncated' if res.stdout_size > len(res.stdout.encode()) else ''})")
    sys.stdout.write(res.stdout if res.stdout.endswith("\n") or not res.stdout else res.stdout + "\n")
    print(f"--- stderr ({res.stderr_size} bytes)")
    sys.stdout.write(res.stderr if res.stderr.endswith("\n") or not res.stderr else res.stderr + "\n")
    print("---")
    print(f"exit code  {res.exit_code}{' (timed out)' if res.timed_out else ''}")
    if res.limit_hit:
        print(f"limit hit  {res.limit_hit}")
    print(f"duration   {res.duration_ms:.1f} ms")
    print(f"clock      {res.clock} (UTC)   seed {args.seed}, step {res.step}")
    print(f"cwd        {res.cwd} -> {res.state_after.cwd}")
    if res.state_after.exports:
        print("exports    " + " ".join(f"{k}={v}" for k, v in res.state_after.exports.items()))
    print(f"mechanisms {', '.join(res.mechanisms)}")
    return res.exit_code


def shell_line(words: list[str]) -> str:
    """The shell line for `tttr sandbox exec -- WORDS`: one word is a shell line as it is;
    several are one argv, quoted so that bash runs exactly those arguments."""
    from tttr.recorders.errors import SandboxError

    if words and words[0] == "--":  # argparse keeps a second `--`; no command is named that
        words = words[1:]
    if not words or not "".join(words).strip():
        raise SandboxError("no command given: put it after --, e.g. tttr sandbox exec -- ls -l")
    return words[0] if len(words) == 1 else shlex.join(words)


def cmd_probe(args) -> int:
    from tttr.recorders.probe import probe

    support = probe()
    if args.json:
        print(json.dumps(support.to_json(), indent=2))
    else:
        print(support.line())
    return 0 if support.ok else 1


def cmd_tasks(args) -> int:
    from tttr.recorders.tasks import list_tasks

    tasks = list_tasks()
    if args.json:
        print(json.dumps([t.to_json() for t in tasks], indent=2))
        return 0
    width = max(len(t.name) for t in tasks)
    for t in tasks:
        tags = ",".join(t.tags)
        print(f"{t.name:<{width}}  {t.difficulty:<6}  {t.clock.isoformat()}  {tags:<18}  {t.instruction}")
    return 0


def cmd_task_check(args) -> int:
    from tttr.recorders.clock import parse_clock
    from tttr.recorders.errors import TaskError
    from tttr.recorders.tasks import list_tasks, resolve_task, self_check

    if args.all == bool(args.name):
        raise TaskError("give one task NAME or --all (see `tttr tasks`)")
    tasks = list_tasks() if args.all else [resolve_task(args.name)]
    clock = parse_clock(args.clock) if args.clock is not None else None
    results = []
    for task in tasks:
        r = self_check(task, seed=args.seed, unsafe_no_sandbox=args.unsafe_no_sandbox, clock=clock)
        results.append(r)
        if not args.json:
            verdict = "ok  " if r.ok else "FAIL"
            print(f"{verdict} {task.name:<16} solution {({True: 'passes', None: 'absent'}).get(r.solution_passes, 'FAILS')}, "
                  f"nothing {'fails' if r.nothing_fails else 'PASSES'}" + (f"  ({r.detail})" if r.detail else ""))
    bad = [r.name for r in results if not r.ok]
    if args.json:
        print(json.dumps([{"name": r.name, "ok": r.ok, "solution_passes": r.solution_passes,
                           "nothing_fails": r.nothing_fails, "detail": r.detail} for r in results], indent=2))
    else:
        print(f"{len(results) - len(bad)}/{len(results)} tasks ok" + (f"; failing: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0
