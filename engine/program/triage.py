"""`tttr triage` and `tttr bisect` on recorded programs (`tttr record -- PROGRAM`): the
built-in agent's experiments (engine/replay/triage.py, bisect.py) with a program's replay.

A test is a program fork with several changes at once (engine/program/fork.py, not strict):
the replayed run with a subset of the deltas between the two recordings
(engine/program/deltas.py) put in place, each where its site comes as recorded or, after the
program diverged, where its request comes again. It is stored as a child run, and judged:

- `outcome`: the --check the program was recorded with, run again on the test's end tree
  (exit 0 passes; the recording's verdict is its own check's);
- `actions`: the program's state-modifying actions — its SDK tool calls (function and
  arguments, or command) in order, then its end tree — differ from GOOD's.

triage replays BAD once per layer with that layer's deltas from GOOD (trace: the clock
reads and tool results; token: the sampled tokens where the prompt matches, with their
call's seed, and the run's seed; tensor: never differs, every call is served under
invariant kernels); bisect runs ddmin over BAD's deltas applied to GOOD, with the built-in
agent's round driver (engine/replay/bisect.py's `run_rounds`). A round's independent tests
run side by side, each program in a sandbox of its own, and every model call they generate
goes to one engine (`SharedModel`), so the calls of programs running at once share its
forward passes: sound because the kernels are batch-invariant (a test's tokens and logits
are those it gets alone); under other kernels, or with `batch=False`, one at a time.
triage's (up to three) replays run at once the same way (engine/replay/triage.py's
`replay_layers`).

Before anything is written: the pair is checked (one program, one start tree, one model,
deltas between them), BAD fails the judge, and GOOD passes it on a faithful replay made in
a scratch copy of the database."""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable

from tttr.engine.program.deltas import ProgramPair, differing
from tttr.engine.program.live import LiveCalls
from tttr.engine.replay.bisect import Bisect, choose_batching, run_rounds
from tttr.engine.replay.deltas import SEED, Delta, counted
from tttr.engine.replay.result import ReplayError
from tttr.engine.replay.triage import LayerResult, Triage, replay_layers
from tttr.engine.replay.trial import Judge, Trial
from tttr.recorders.scratch import scratch_dir
from tttr.recorders.treeio import remove_tree
from tttr.sessions.vocabulary import site_order

ONE_AT_A_TIME = "tests run one at a time, each program in a sandbox of its own"
BATCHED = ("independent tests of a round run side by side, each program in a sandbox of its own, their model calls "
           "batched through one engine (sound: the kernels are batch-invariant)")
TRIAGE_BATCHED = ("the layers' replays ran side by side, each program in a sandbox of its own, their model calls "
                  "batched through one engine (sound: the kernels are batch-invariant)")


@dataclass(frozen=True, slots=True)
class Setup:
    """A checked experiment: the pair (deltas apply to its base), the judge, the deltas, and
    the check command the outcome judge runs."""

    pair: ProgramPair
    judge: Judge
    deltas: list[Delta]
    check: str | None


class SharedModel:
    """The model an experiment's tests generate their calls on: loaded once, by the first test
    that needs it, kept until the experiment ends (`release`). Tests may run at once (a
    batched bisect round), so each test binds a view of its own (`bind(recorder)`, from
    engine/program/fork.py's replayer) that records its calls into its own run, while every call
    goes to the one engine, where the calls of tests running at once share forward passes."""

    def __init__(self, model: str | None, model_id: str | None):
        self.model, self.model_id = model, model_id
        self._lock = threading.Lock()
        # The load, in a thread that lasts until `release` (engine/program/live.py); it records
        # nothing: a test's calls are recorded by its own view.
        self._loader = LiveCalls(model, SimpleNamespace(service=None), model_id)

    def bind(self, recorder) -> "_TestCalls":
        return _TestCalls(self, recorder)

    def start_loading(self) -> None:
        with self._lock:  # one load, whichever tests ask at once
            self._loader.start_loading()

    def service(self):
        """The loaded Service (loading it, or waiting for its load, if need be); raises what the load raised."""
        self.start_loading()
        return self._loader._service()  # waits for the load; not under the lock, which a test's start takes

    def release(self) -> None:
        self._loader.close()


class _TestCalls(LiveCalls):
    """One test's model calls, on its experiment's `SharedModel`, recorded into its run."""

    def __init__(self, shared: SharedModel, recorder):
        super().__init__(shared.model, recorder, shared.model_id)
        self.shared = shared

    def _service(self):
        if self.service is None:
            self.service = self.shared.service()
            self.recorder.service = self.service
        return self.service

    def start_loading(self) -> None:
        self.shared.start_loading()

    def close(self) -> None:
        """A test ends: the model stays."""


def program_actions(store, run_id: int) -> list[str]:
    """A program run's state-modifying actions: each SDK tool call, then its end tree."""
    _, events = store.load_run(run_id)
    out = []
    for e in sorted((e for e in events if e.kind == "tool" and isinstance(e.value, dict)), key=lambda e: e.seq):
        v = e.value
        if "program" in v:
            out.append(f"end tree {str(v.get('tree_after'))[:16]}")
        elif "function" in v:
            args = json.dumps([v.get("args", []), v.get("kwargs", {})], sort_keys=True, default=str)[1:-1]
            out.append(f"{v['function']}({args})")
        else:
            out.append(f"$ {v.get('cmd')}")
    return out


def _passed(store, run_id: int) -> bool | None:
    outcome = store.run(run_id).outcome
    return outcome.passed if outcome is not None else None


def prepare(db: str, base: int, other: int, good: int, how: str, *, model: str | None = None,
            unsafe_no_sandbox: bool = False, compared: tuple[ProgramPair, list[Delta]] | None = None) -> Setup:
    """Everything checked before anything is written to `db`; DeltaError/ReplayError (one line).
    `compared`: the pair (`base` the base) and its deltas as the run's kind found them
    (engine/kinds.py's `compare`, which a check asks); None: loaded here."""
    from tttr.engine.program.fork import recorded_check
    from tttr.sessions.store import Store

    bad = other if good == base else base
    with Store.open(db, create=False, readonly=True) as store:
        if compared is None:
            pair = ProgramPair.load(store, base, other)
            compared = pair, differing(pair)
        pair, found = compared
        checks = {rid: recorded_check(store, store.run(rid)) for rid in (good, bad)}
        if how == "outcome":
            missing = [rid for rid, c in checks.items() if c is None]
            if missing:
                raise ReplayError(f"run {missing[0]} was recorded without --check, so it has no outcome to judge: "
                                  "record the program with --check CMD, or compare actions with --judge actions")
            if checks[good] != checks[bad]:
                raise ReplayError(f"runs {good} and {bad} were recorded with different checks ({checks[good]!r} and "
                                  f"{checks[bad]!r}): give two runs judged by the same --check")
        judge = Judge(how, tuple(program_actions(store, good)))
        bad_passed = _passed(store, bad)
        if how == "outcome" and bad_passed is None:
            raise ReplayError(f"run {bad} (BAD) has no checker verdict: give a run recorded, replayed or forked "
                              "with the program's --check")
        if not judge.fails(bad_passed, program_actions(store, bad)):
            what = "passed its check" if how == "outcome" else "took the same actions as GOOD"
            hint = "; compare their actions with --judge actions" if how == "outcome" else ""
            raise ReplayError(f"run {bad} (BAD) {what}: there is no failure to locate{hint}")
    setup = Setup(pair, judge, found, checks[good])
    _check_good(db, good, setup, model=model, unsafe_no_sandbox=unsafe_no_sandbox)
    return setup


def _check_good(db: str, good: int, setup: Setup, *, model, unsafe_no_sandbox: bool) -> None:
    """GOOD passes its own judge on a faithful replay, made in a scratch copy of `db` (so
    that a refusal writes nothing): ReplayError in one line otherwise."""
    work = scratch_dir("tttr-triage-")
    try:
        scratch = str(work / "scratch.db")
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as src, sqlite3.connect(scratch) as dst:
            src.backup(dst)
        trial = apply(scratch, good, [], setup, model=model, unsafe_no_sandbox=unsafe_no_sandbox)
    finally:
        remove_tree(work)
    if trial.failed:
        why = (f"its check {'failed' if trial.passed is False else 'gave no verdict'}" if setup.judge.how == "outcome"
               else "its actions changed")
        raise ReplayError(f"run {good} (GOOD) fails on a faithful replay ({why}): give a GOOD run that passes "
                          f"when replayed (tttr replay {good} shows what differs)")


def apply(db: str, base: int, subset: list[Delta], setup: Setup, *, model: str | None = None,
          unsafe_no_sandbox: bool = False, cancel: threading.Event | None = None, live: SharedModel | None = None
          ) -> Trial:
    """Replay program run `base` of `db` with `subset` (deltas against it) in place, as a child run."""
    from tttr.engine.program.fork import ForkPlan, shared_before
    from tttr.engine.program.replay import replay_program
    from tttr.engine.replay.source import Source
    from tttr.sessions.store import Store

    other = setup.pair.other.run if setup.pair.base.run.id == base else setup.pair.base.run
    changes = tuple(sorted((d.mutation for d in subset if d.mutation is not None), key=lambda c: site_order(str(c.site))))
    sites = sorted((d.site for d in subset), key=site_order)
    seed = other.seed if any(d.site == SEED for d in subset) else None
    fork_seq, shared = 0, frozenset()
    with Store.open(db, create=False, readonly=True) as store:
        source = Source(store, base)
        if changes and seed is None and not changes[0].at_setup:
            fork_seq, shared = source.seq_of(str(changes[0].site)), shared_before(source, changes[0].site)
    mutation = {"site": sites[0], "value": counted(len(subset)), "input": f"{counted(len(subset))} from run "
                f"{other.id}: " + ", ".join(sites), "deltas": [d.site for d in subset]} if subset else None
    plan = ForkPlan(base, changes, fork_seq, model, shared, strict=False, seed=seed, check=setup.check,
                    meta={"experiment": {"deltas_from": other.id, "sites": sites}}, mutation=mutation, cancel=cancel,
                    live=live)
    res = replay_program(db, base, unsafe_no_sandbox=unsafe_no_sandbox, fork=plan, model=model)
    with Store.open(db, create=False, readonly=True) as store:
        actions = program_actions(store, res.run_id)
    passed = res.passed  # the stored outcome, as the result carries it
    status = "incomplete" if cancel is not None and cancel.is_set() else res.status
    failed = setup.judge.fails(passed, actions) if status == "complete" else True
    return Trial(res.run_id, list(subset), list(res.extra.get("applied", [])), passed, actions, failed,
                 {"status": status, "divergence": res.divergence.to_json() if res.divergence else None})


def triage(db: str, good: int, bad: int, *, judge: str = "outcome", model: str | None = None, batch: bool = True,
           unsafe_no_sandbox: bool = False, on_layer: Callable[[LayerResult], None] | None = None,
           cancel: threading.Event | None = None, setup: Setup | None = None, ray: Callable[[str], Any] | None = None) -> Triage:
    """Replay BAD once per layer with GOOD's values of that layer in place; the replays side
    by side with `batch` under invariant kernels. `setup`: the caller's
    `prepare(db, bad, good, good, judge)`, if it checked the input already. `ray`: the Ray tests
    of a database (engine/kinds.py's `ray_tests`: each replay a Ray task), or None: here."""
    setup = setup or prepare(db, bad, good, good, judge, model=model, unsafe_no_sandbox=unsafe_no_sandbox)
    out = Triage(good, bad, judge, batch_note=ONE_AT_A_TIME)
    choose_batching(out, {setup.pair.base.run.kernel_mode, setup.pair.other.run.kernel_mode}, batch, TRIAGE_BATCHED)
    stop = cancel or threading.Event()
    if ray is not None:
        tests, test = _on_ray(db, ray, bad, good, setup, model, unsafe_no_sandbox, stop)
        return tests.noted(replay_layers(out, setup.deltas, test, stop=stop, on_layer=on_layer))
    live = SharedModel(model, setup.pair.base.run.model_id)

    def replay(subset: list[Delta]) -> Trial:  # opens its own connections: it may run in any thread
        return apply(db, bad, subset, setup, model=model, unsafe_no_sandbox=unsafe_no_sandbox, cancel=stop, live=live)

    try:
        return replay_layers(out, setup.deltas, replay, stop=stop, on_layer=on_layer)
    finally:
        live.release()


def bisect(db: str, good: int, bad: int, *, judge: str = "outcome", max_replays: int = 50, model: str | None = None,
           batch: bool = True, unsafe_no_sandbox: bool = False, on_round: Callable | None = None,
           on_trial: Callable[[Trial], None] | None = None, cancel: threading.Event | None = None,
           setup: Setup | None = None, ray: Callable[[str], Any] | None = None) -> Bisect:
    """ddmin over BAD's deltas applied to GOOD; a round's independent tests side by side with
    `batch` under invariant kernels. The whole set is tested first: if it does not reproduce
    the failure, ReplayError (that replay stays stored). Ctrl-C or the budget ends it with the
    best set so far. `setup`: the caller's `prepare(db, good, bad, good, judge)`, if it
    checked the input already. `ray`: the Ray tests of a database, or None."""
    if max_replays < 1:
        raise ReplayError(f"--max-replays {max_replays}: give at least 1")
    setup = setup or prepare(db, good, bad, good, judge, model=model, unsafe_no_sandbox=unsafe_no_sandbox)
    out = Bisect(good, bad, judge, setup.deltas, batch_note=ONE_AT_A_TIME)
    choose_batching(out, {setup.pair.base.run.kernel_mode, setup.pair.other.run.kernel_mode}, batch, BATCHED)
    stop = cancel or threading.Event()
    if ray is not None:
        tests, test = _on_ray(db, ray, good, bad, setup, model, unsafe_no_sandbox, stop)
        return tests.noted(run_rounds(out, test, max_replays=max_replays, stop=stop, on_round=on_round,
                                      on_trial=on_trial))
    live = SharedModel(model, setup.pair.base.run.model_id)

    def test(subset: list[Delta]) -> Trial:  # opens its own connections: it may run in any thread
        return apply(db, good, subset, setup, model=model, unsafe_no_sandbox=unsafe_no_sandbox, cancel=stop, live=live)

    try:
        return run_rounds(out, test, max_replays=max_replays, stop=stop, on_round=on_round, on_trial=on_trial)
    finally:
        live.release()


def _on_ray(db: str, ray: Callable[[str], Any], base: int, other: int, setup: Setup, model, unsafe_no_sandbox: bool,
            stop: threading.Event):
    """The RayTests of `db`, and a test of program run `base` with a subset of the deltas as a
    Ray task (engine/replay/ray_experiments.py)."""
    tests = ray(db)

    def test(subset: list[Delta]) -> Trial:
        return tests.program(base, other, subset, setup.judge, check=setup.check, model=model,
                             unsafe_no_sandbox=unsafe_no_sandbox, stop=stop)

    return tests, test


__all__ = ["BATCHED", "ONE_AT_A_TIME", "TRIAGE_BATCHED", "SharedModel", "bisect", "prepare", "program_actions", "triage"]
