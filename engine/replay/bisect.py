"""Bisect across layers: Zeller's delta debugging (ddmin) over BAD's deltas applied to GOOD.
Each test replays GOOD with a subset of the deltas applied and asks the judge whether it
fails; the result is a minimal failure-inducing set — removing any one of its deltas makes
the failure disappear — with the replays used and each tested subset as a stored run.

`ddmin` is the algorithm alone, over any items and any test; `run_rounds` drives a bisect's
tests (the whole set, then ddmin's rounds, batched or not) for any kind of run, `at_once`
running a batch side by side (triage's layer replays too); `bisect` runs it on two
recordings of the built-in agent (engine/program/triage.py on two recorded programs). With
`batch`, the independent tests of a round (its parts, then its complements) run side by
side, each in its own thread and store connection, so their forward passes share the
engine's batches and their commands run at once; the whole set's test runs beside the first
round's. That is sound only because the kernels are batch-invariant: under `fast`
kernels the tests run one at a time. Batching may test a part that one-at-a-time ddmin would
have skipped (it stops at the first failing part), or a part of a whole set that turns out
not to fail (then the bisect is refused as before, its replays stored).

Either way the tests share the prefixes of their live steps' prompts (`Runtime.reusing_prefixes`):
every step of every test starts with the same system prompt and examples, and a test's step
k prompt extends its step k-1 prompt, so a step prefills only what is new. Under `invariant`
kernels that leaves every token and logits digest as it was (the prefill is compute-bound, so
without it batching could not save the time a test spends there).
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Generic, Sequence, TypeVar

from tttr.engine.replay.deltas import Delta, Pair, differing
from tttr.engine.replay.result import ReplayError
from tttr.engine.replay.trial import Judge, Trial, apply, check_ends, recorded_actions
from tttr.kernels.mode import is_invariant

T = TypeVar("T")
R = TypeVar("R")


class Budget(Exception):
    """The test budget is spent: the current failing set is the best so far."""


@dataclass(slots=True)
class DDResult(Generic[T]):
    items: list[T]  # the smallest failing set found
    tests: int  # tests run (cached repeats not counted)
    minimal: bool  # ddmin finished: removing any single item makes the failure disappear
    stopped: str | None = None  # "budget", "interrupted", or None


def ddmin(items: Sequence[T], fails: Callable[[list[T]], bool], *, max_tests: int | None = None,
          fails_many: Callable[[list[list[T]]], list[bool]] | None = None,
          on_round: Callable[[int, int, list[T], int], None] | None = None,
          known: Sequence[tuple[list[T], bool]] = ()) -> DDResult[T]:
    """Zeller & Hildebrandt's ddmin. `items` must fail as a whole (not tested here); each
    subset is tested at most once. `fails_many`, if given, tests a round's parts (then its
    complements) together while the budget allows. `known`: subsets already tested, with
    their results (counted as tests). `on_round(round, granularity, current, tests)`."""
    cache: dict[tuple[int, ...], bool] = {}
    index = {id(x): i for i, x in enumerate(items)}
    tests = 0
    for subset, result in known:
        key = tuple(sorted(index[id(x)] for x in subset))
        tests += key not in cache
        cache[key] = result

    def test(subset: list[T]) -> bool:
        nonlocal tests
        key = tuple(sorted(index[id(x)] for x in subset))
        if key not in cache:
            if max_tests is not None and tests >= max_tests:
                raise Budget()
            tests += 1
            cache[key] = fails(subset)
        return cache[key]

    def first_failing(subsets: list[list[T]]) -> list[T] | None:
        nonlocal tests
        todo = {key: s for s in subsets if (key := tuple(sorted(index[id(x)] for x in s))) not in cache}
        if fails_many is not None and len(todo) > 1 and (max_tests is None or tests + len(todo) <= max_tests):
            results = fails_many(list(todo.values()))
            tests += len(todo)
            cache.update(zip(todo, results))
        return next((s for s in subsets if test(s)), None)

    current, n, rnd = list(items), 2, 0
    try:
        while len(current) >= 2:
            rnd += 1
            if on_round is not None:
                on_round(rnd, n, current, tests)
            chunks = _split(current, n)
            reduced = first_failing(chunks)
            if reduced is not None:
                current, n = reduced, 2
                continue
            complement = None
            if n > 2:
                complement = first_failing([[x for j, c in enumerate(chunks) if j != i for x in c]
                                            for i in range(len(chunks))])
            if complement is not None:
                current, n = complement, max(n - 1, 2)
                continue
            if n >= len(current):
                break
            n = min(2 * n, len(current))
    except Budget:
        return DDResult(current, tests, False, "budget")
    except KeyboardInterrupt:
        return DDResult(current, tests, False, "interrupted")
    return DDResult(current, tests, True)


def _split(items: list[T], n: int) -> list[list[T]]:
    size, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return [c for c in out if c]


@dataclass(slots=True)
class Bisect:
    good: int
    bad: int
    judge: str
    deltas: list[Delta]
    trials: list[Trial] = field(default_factory=list)
    result: DDResult | None = None
    batched: bool = False
    batch_note: str = "tests run one at a time"

    @property
    def replays(self) -> int:
        return len(self.trials)

    def to_json(self) -> dict:
        r = self.result
        return {"good": self.good, "bad": self.bad, "judge": self.judge, "deltas": [d.to_json() for d in self.deltas],
                "minimal": None if r is None else [d.to_json() for d in r.items],
                "layers": sorted({d.layer for d in r.items}) if r else [],
                "is_minimal": bool(r and r.minimal), "stopped": r.stopped if r else None,
                "replays": self.replays, "batched": self.batched, "batch_note": self.batch_note, "tests": [t.to_json() for t in self.trials]}


def prepare(store, good: int, bad: int, judge: str, *, runtime, unsafe_no_sandbox: bool = False,
            compared: tuple[Pair, list[Delta]] | None = None) -> tuple[Pair, Judge, list[Delta]]:
    """Checked before anything is written: the pair, BAD's deltas against GOOD, GOOD's
    faithful replay and BAD's failure. `compared`: the pair (GOOD the base) and its deltas
    as the run's kind found them (engine/kinds.py's `compare`); None: loaded here."""
    pair = compared[0] if compared is not None else Pair.load(store, good, bad)
    found = compared[1] if compared is not None else differing(pair)
    the_judge = Judge(judge, tuple(recorded_actions(pair.base)))
    check_ends(store, pair, the_judge, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox)
    return pair, the_judge, found


def on_store(prepared: tuple[Pair, Judge, list[Delta]], store) -> tuple[Pair, Judge, list[Delta]]:
    """What a check's `prepare` returned (read on a read-only connection), read through `store`,
    the connection the experiment writes with: nothing decoded or replayed again."""
    pair, the_judge, found = prepared
    return Pair(pair.base.on(store), pair.other.on(store)), the_judge, found


def bisect(store, good: int, bad: int, *, judge: str = "outcome", max_replays: int = 50, runtime,
           batch: bool = True, unsafe_no_sandbox: bool = False, on_round: Callable | None = None,
           on_trial: Callable[[Trial], None] | None = None, cancel: threading.Event | None = None,
           ray: Callable[[str], Any] | None = None, prepared: tuple | None = None) -> Bisect:
    """ddmin over BAD's deltas applied to GOOD. The whole set is tested first: if it does not
    reproduce the failure, ReplayError (that replay stays stored). Ctrl-C or the budget
    ends it with the best set so far. `ray`: the Ray tests of a database (engine/kinds.py's
    `ray_tests`: each test a Ray task, engine/replay/ray_experiments.py); None: here. `prepared`: what
    the check's `prepare` returned, so GOOD is not replayed faithfully a second time."""
    if max_replays < 1:
        raise ReplayError(f"--max-replays {max_replays}: give at least 1")
    pair, the_judge, found = (on_store(prepared, store) if prepared is not None else
                              prepare(store, good, bad, judge, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox))
    out = Bisect(good, bad, judge, found)
    stop = cancel or threading.Event()
    choose_batching(out, {pair.base.run.kernel_mode, pair.other.run.kernel_mode}, batch,
                    "independent tests of a round run batched (sound: the kernels are batch-invariant)")
    if ray is not None:
        tests = ray(store.path)

        def on_ray(subset: list[Delta]) -> Trial:
            return tests.agent(good, bad, subset, the_judge, model=str(runtime.path), kernel_mode=runtime.kernel_mode,
                               unsafe_no_sandbox=unsafe_no_sandbox, stop=stop)

        return tests.noted(run_rounds(out, on_ray, max_replays=max_replays, stop=stop, on_round=on_round,
                                      on_trial=on_trial))

    def test(subset: list[Delta]) -> Trial:
        return apply(store, pair, subset, the_judge, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox,
                     cancel=stop)

    def test_aside(subset: list[Delta]) -> Trial:
        from tttr.sessions.store import Store

        with Store.open(store.path, create=False) as own:  # a connection per thread
            return apply(own, Pair.load(own, good, bad), subset, the_judge, runtime=runtime,
                         unsafe_no_sandbox=unsafe_no_sandbox, cancel=stop)

    with runtime.reusing_prefixes():  # the tests replay one recording: their live steps share prefixes
        return run_rounds(out, test, test_aside=test_aside, max_replays=max_replays, stop=stop, on_round=on_round,
                          on_trial=on_trial)


def choose_batching(out, modes: set[str], batch: bool, batched_note: str) -> None:
    """Batch an experiment's tests (`out.batched`, with `batched_note`; `out` a Bisect or a
    Triage) only if asked and every kernel mode in play is batch-invariant; `out.batch_note`
    says why not otherwise."""
    variant = sorted(m for m in modes if not is_invariant(m))
    if batch and variant:
        out.batch_note = (f"tests run one at a time: {' and '.join(variant)} kernels are not batch-invariant, "
                          "so tests batched together could change each other's results")
    elif batch:
        out.batched, out.batch_note = True, batched_note


def run_rounds(out: Bisect, test: Callable[[list[Delta]], Trial], *, max_replays: int, stop: threading.Event,
               test_aside: Callable[[list[Delta]], Trial] | None = None, on_round: Callable | None = None,
               on_trial: Callable[[Trial], None] | None = None) -> Bisect:
    """The bisect's rounds, for any kind of run (the built-in agent's here, a recorded
    program's in engine/program/triage.py): the whole set `out.deltas`, then ddmin. `test(subset)`
    runs one test in this thread; with `out.batched`, a round's independent tests run side by
    side, each `test_aside(subset)` (default `test`) in a thread of its own. Each trial goes to
    `out.trials` and `on_trial`; ddmin's verdict to `out.result`. ReplayError if the whole set
    does not fail. Ctrl-C sets `stop` (the tests in flight end early, as incomplete runs, and
    stay listed) and ends with the best set so far."""
    found = out.deltas
    aside = test_aside or test

    def done(trial: Trial) -> bool:
        out.trials.append(trial)
        if on_trial is not None:
            on_trial(trial)
        return trial.failed

    def fails(subset: list[Delta]) -> bool:
        return done(test(subset))

    def fails_many(subsets: list[list[Delta]]) -> list[bool]:
        trials: list[Trial | None] = [None] * len(subsets)

        def keep(i: int, trial: Trial) -> None:
            trials[i] = trial

        try:
            at_once([partial(aside, s) for s in subsets], stop=stop, on_done=keep)
        except KeyboardInterrupt:  # the batch's runs in flight ended as incomplete runs; ddmin keeps its best set
            out.trials.extend(t for t in trials if t is not None)
            raise
        return [done(t) for t in trials]

    # Batched, the whole set is tested beside the first round's parts (which do not depend
    # on its result): one batch instead of two in a row. Its failure is still required.
    first = _split(found, 2) if out.batched and len(found) >= 2 and max_replays - 1 >= 2 else []
    if first:
        if on_round is not None:
            on_round(1, 2, list(found), 0)
        before = len(out.trials)
        try:
            whole, *parts = fails_many([found] + first)
        except KeyboardInterrupt:
            tried = out.trials[before:]
            if tried and tried[0].deltas == found and tried[0].failed and tried[0].extra.get("status") == "complete":
                out.result = DDResult(list(found), len(tried) - 1, False, "interrupted")  # the best so far
                return out
            raise
        whole_run = out.trials[before].run_id
    else:
        whole = fails(found)
        whole_run = out.trials[-1].run_id
    if not whole:
        raise ReplayError(f"BAD's {len(found)} deltas applied to GOOD do not reproduce the failure "
                          f"(replay {whole_run}): the difference is not in the recorded values")
    out.result = ddmin(found, fails, max_tests=max_replays - 1, on_round=_after_first(on_round, bool(first)),
                       fails_many=fails_many if out.batched else None, known=list(zip(first, parts)) if first else ())
    return out


def _after_first(on_round: Callable | None, shown: bool) -> Callable | None:
    """`on_round`, less round 1 when it was shown already (its tests ran beside the whole set's)."""
    if on_round is None or not shown:
        return on_round
    return lambda rnd, *rest: None if rnd == 1 else on_round(rnd, *rest)


def at_once(jobs: Sequence[Callable[[], R]], *, stop: threading.Event,
            on_done: Callable[[int, R], None] | None = None) -> list[R]:
    """Run `jobs` side by side, each in a thread of its own, and return their results in the
    jobs' order; `on_done(i, result)` runs in this thread as job i finishes (in the order they
    finish). If a job raises, `on_done` raises (a caller's way to stop), or Ctrl-C comes while
    waiting, `stop` is set, so that the jobs in flight end early (as incomplete runs, stored);
    they are still waited for and each is still passed to `on_done`, then the first raise goes on."""
    results: list = [None] * len(jobs)
    first: BaseException | None = None
    with ThreadPoolExecutor(max_workers=max(len(jobs), 1)) as pool:
        index = {pool.submit(job): i for i, job in enumerate(jobs)}
        pending = set(index)
        while pending:
            try:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            except KeyboardInterrupt as exc:
                first = first or exc
                stop.set()
                continue
            for future in sorted(finished, key=index.__getitem__):
                i = index[future]
                try:
                    results[i] = future.result()
                    if on_done is not None:
                        on_done(i, results[i])
                except BaseException as exc:  # noqa: BLE001 - raised again once every job has ended
                    first = first or exc
                    stop.set()
    if first is not None:
        raise first
    return results
