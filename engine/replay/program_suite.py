"""A suite whose agent is the user's program: `tttr suite --tasks-dir DIR --runs N -- PROGRAM ARG...`.

Each run is `tttr record -- PROGRAM` (engine/program/record.py, called as it is): the program
runs in the sandbox on a fresh copy of the task's start tree (tree/, then setup.sh, run in the
sandbox with the run's clock and seed), with the instruction in the environment
(`TTTR_TASK_INSTRUCTION`) and in the file `TTTR_TASK.md` at the top of the tree, its model
calls answered by the in-process server (the engine), and the task's check.sh as its check.
Files that the command line names by a relative path that exists here (`agent.py`) are copied
into the tree at that path, as `tttr record --tree` needs the program inside the tree.

The conditions, as the program's machinery allows them today:

- `free`: a recording with a fresh sandbox seed (or one derived from `--seed`) and the
  machine's clock; the server draws each model call's seed (unless the program sends one).
- `trace-pinned`: a recording with the anchor's clock, sandbox seed and start tree (rebuilt by
  the same setup, checked against the anchor's digest); the model's seeds drawn afresh. Tools
  and commands run live from that same state.
- `token-pinned`: the token layer pinned, the trace free, as for the built-in agent. A
  recording with the anchor's sandbox seed (the sandbox's randomness moves with the token
  layer) and the machine's clock, on a start tree that the task's setup builds at that clock,
  whose model calls get the anchor's call seeds in order (`record_program(call_seeds=...)`;
  a call that sends its own seed keeps it). Tools, commands and clock reads run live. Under
  the invariant kernels a call's tokens follow from its prompt and its seed alone (the draw at
  a position depends on the seed and the position only), so a call whose prompt is the
  anchor's gets the anchor's tokens (its answer pinned), and a call whose prompt the live world
  changed is sampled live from the anchor's RNG stream: the built-in agent's "recorded token
  forced while the context is identical, then the recorded RNG stream". Its calls are
  computed, not read back.
- `pinned`: `tttr replay` of the anchor: every model call, SDK tool result and clock read
  answered from the recording. It must agree 100%.

Statistics (`suite.read_run`) group a program run under its suite task (`meta.suite.task`, the
run's own task being `program:NAME`) and compare pairs on their model calls (the answers, in
order), their tool calls (state-modifying, as for the built-in agent: the SDK's tools and the
program's own command carry the tree before and after) and their checked outcome.
"""

from __future__ import annotations

import os
import shutil
import threading
from datetime import datetime
from pathlib import Path
from typing import Callable

from tttr.recorders.tasks import INSTRUCTION_ENV as ENV_NAME
from tttr.recorders.tasks import INSTRUCTION_FILE

PROGRAM_CONDITIONS = ("free", "token-pinned", "trace-pinned", "pinned")


def call_seeds(store, run_id: int) -> list[int]:
    """The seeds a program run's model calls were given by the server (not sent), in order."""
    out = []
    for e in store.events(run_id, kind="prompt"):
        v = e.value if isinstance(e.value, dict) else {}
        seed = v.get("sampling", {}).get("seed") if isinstance(v.get("sampling"), dict) else None
        if v.get("seed_drawn") is True and isinstance(seed, int) and not isinstance(seed, bool):
            out.append(seed)
    return out


def program_files(argv: list[str], cwd: Path) -> list[str]:
    """The relative paths of the command line that are files here: copied into each tree."""
    out = []
    for a in argv:
        p = Path(a)
        if a and not p.is_absolute() and ".." not in p.parts and (cwd / p).is_file():
            out.append(a)
    return out


def build_tree(task, dest: Path, *, seed: int, clock, files: list[str], cwd: Path, unsafe_no_sandbox: bool) -> None:
    """The task's start tree in `dest` (setup in the sandbox), the instruction file and the
    program's files."""
    from tttr.recorders.sandbox import Executor

    dest.mkdir(parents=True, exist_ok=True)
    with Executor(dest, seed=seed, unsafe_no_sandbox=unsafe_no_sandbox) as ex:
        task.setup(dest, ex, clock)
    (dest / INSTRUCTION_FILE).write_text(task.instruction + "\n")
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(cwd / f, target)


def run_program_suite(
    db: str, tasks: list[str], runs: int, argv: list[str], *, model: str | None = None, timeout_s: float = 600.0,
    unsafe_no_sandbox: bool = False, suite_id: str | None = None, label: str | None = None, resume: bool = False,
    task_dirs: list[str] | None = None, seed: int | None = None, progress: Callable | None = None,
    cancel: threading.Event | None = None, cwd: Path | None = None, clock: datetime | None = None,
):
    """Record the program suite into `db` (runs one after the other: each recording loads the
    model in its own server); the suite id and the runs that finished."""
    from tttr.engine.program.record import record_program
    from tttr.engine.program.replay import replay_program
    from tttr.engine.replay.suite import (Finished, Resumed, SuiteError, _now_utc, _suite_meta, free_seed,
                                          new_suite_id, read_run, read_suite)
    from tttr.recorders.scratch import scratch_dir
    from tttr.recorders.tasks import load_task
    from tttr.recorders.treeio import remove_tree
    from tttr.sessions.store import Store

    if not argv:
        raise SuiteError("no program given after --: e.g. tttr suite --tasks-dir DIR --runs 3 -- python3 agent.py")
    cwd = cwd or Path.cwd()
    files = program_files(argv, cwd)
    suite_id = suite_id or new_suite_id()
    cancel = cancel or threading.Event()
    settings = {"settings": {"tasks": list(tasks), "runs": runs, "label": label, "seed": seed, "program": list(argv),
                             "clock": clock.isoformat() if clock is not None else None,
                             "task_dirs": [str(Path(d).absolute()) for d in task_dirs or ()]}}
    Store.open(db, create=True).close()
    before = Resumed({}, frozenset(), {}, [])
    if resume:
        with Store.open(db, create=False) as store:
            before = read_suite(store, suite_id)
    jobs = [(t, c, i) for c in PROGRAM_CONDITIONS for t in tasks for i in range(runs) if (t, c, i) not in before.done]
    finished = []
    anchors = dict(before.anchors)
    anchor_runs: dict[str, object] = {}

    def meta(task, condition, index, anchor):
        m = _suite_meta(suite_id, condition, index, anchor, settings)
        m["suite"].update(task=task.name, agent="program")
        return {**m, "task_env": {ENV_NAME: task.instruction}}

    for n, (name, condition, index) in enumerate(jobs, 1):
        if cancel.is_set():
            break
        task = load_task(name)
        anchor = anchors.get(name)
        if condition != "free" and anchor is None:
            continue  # no complete free run: nothing to pin to
        run_id = None
        error = None
        seeds = None  # the anchor's call seeds: token-pinned only
        try:
            if condition == "pinned":
                res = replay_program(db, anchor, unsafe_no_sandbox=unsafe_no_sandbox, model=model,
                                     meta=meta(task, condition, index, anchor))
                run_id = res.run_id
            else:
                if condition == "free":
                    s = free_seed(seed, name, index) if seed is not None else int.from_bytes(os.urandom(4), "little")
                    start = clock or _now_utc().replace(microsecond=0)
                else:
                    with Store.open(db, create=False, readonly=True) as reader:
                        a = anchor_runs.get(name) or reader.run(anchor)
                        anchor_runs[name] = a
                        seeds = call_seeds(reader, anchor) if condition == "token-pinned" else None
                    s = a.seed or 0
                    start = _now_utc().replace(microsecond=0) if condition == "token-pinned" \
                        else datetime.fromisoformat(a.meta.clock)
                work = scratch_dir("tttr-suite-tree-")
                try:
                    build_tree(task, work / "tree", seed=s, clock=start, files=files, cwd=cwd,
                               unsafe_no_sandbox=unsafe_no_sandbox)
                    res = record_program(db, argv, tree=str(work / "tree"), clock=start, seed=s, model=model,
                                         check=task.script("check"), timeout_s=timeout_s,
                                         unsafe_no_sandbox=unsafe_no_sandbox, env={ENV_NAME: task.instruction},
                                         meta=meta(task, condition, index, anchor),
                                         call_seeds=seeds)
                    run_id = res.run_id
                finally:
                    remove_tree(work)
        except KeyboardInterrupt:
            cancel.set()
            raise
        except Exception as exc:  # noqa: BLE001 - one failed run is reported; the suite goes on
            if getattr(exc, "exit_code", None) is not None and n == 1 and not finished:
                raise  # the first run refused (a program that is not there): the user's mistake, said once
            error = f"{type(exc).__name__}: {exc}"
        run = None
        if run_id is not None:
            with Store.open(db, create=False, readonly=True) as reader:
                run = read_run(reader, reader.run(run_id))
            if run is not None:
                finished.append(run)
                if condition == "free" and run.status == "complete":
                    anchors.setdefault(name, run.run_id)
        if progress is not None:
            progress(Finished(len(finished) + (error is not None), len(jobs), name, condition, index, run, error))
    return suite_id, finished
