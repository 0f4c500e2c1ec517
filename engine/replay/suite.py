"""A variance suite: N runs per task under each of four conditions, and their statistics.

How each condition is recorded (every run carries `meta.suite = {id, condition, index,
anchor}`):

- `free` — today's practice: `record` with a fresh seed and the machine's clock at the run's
  start (the actual now, not the task's fixed clock: an evaluation run today sees the day it
  runs on; runs of one suite are minutes apart, so this understates the spread of runs made
  on different days). The first complete free run of a task is its *anchor*.
- `token-pinned` — `replay` of the anchor with the trace layer free (the clock is now and
  every command runs live) and the anchor's seed.
- `trace-pinned` — `replay` of the anchor with the token layer free (a fresh seed per run)
  and the trace pinned: the anchor's clock readings and start tree; a tool call returns the
  recorded result when command and tree match, and otherwise runs live from that state.
- `pinned` — `replay` of the anchor with nothing but the arithmetic live: tokens and trace
  pinned. Its runs must agree 100%.

In all four the logits are computed live with the invariant kernels, in whatever batch they
land in: the tensor layer is pinned by construction. The sandbox's seeded randomness
(`$RANDOM`, `getrandom`) follows the run's seed, so it moves with the token layer.

Runs go through the engine side by side (one thread per run, `batch` at a time): their
forward passes share the scheduler's batches, which changes no result because the kernels
are batch-invariant. Each run is stored as soon as it finishes; a cancelled suite keeps them,
and the runs it was in the middle of end at once, stored as incomplete.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from tttr.engine.replay.variance import CONDITIONS, Decomposition, Outcomes, decompose, outcomes, state_actions
from tttr.sessions.errors import TTTRError
from tttr.sessions.vocabulary import SETUP_STEP, site

# The layers each replayed condition computes live (the tensor layer: with invariant kernels).
FREED = {"token-pinned": ("tensor", "trace"), "trace-pinned": ("tensor", "token"), "pinned": ("tensor",)}


class SuiteError(TTTRError, ValueError):
    pass


@dataclass(frozen=True, slots=True)
class SuiteRun:
    """One stored run of a suite, as the statistics read it."""

    run_id: int
    task: str
    condition: str
    index: int
    status: str
    passed: bool | None
    actions: tuple[str, ...]  # its state-modifying actions
    seed: int | None = None
    start_tree: str | None = None  # the digest of its tree after the task's setup
    label: str | None = None  # the suite's label
    calls: tuple[str, ...] | None = None  # a program's model calls: their answers, in order


@dataclass(frozen=True, slots=True)
class Finished:
    """What the progress callback hears after each run."""

    done: int
    total: int
    task: str
    condition: str
    index: int
    run: SuiteRun | None
    error: str | None = None


def _now_utc() -> datetime:
    """The machine's clock, in UTC like every virtual clock the store holds."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def free_seed(seed: int, task: str, index: int) -> int:
    """Free run `index` of `task` in a suite given `seed`: a 32-bit seed of its own."""
    digest = hashlib.sha256(f"{seed}/{task}/{index}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:4], "little")


def new_suite_id() -> str:
    return datetime.now().strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def _suite_meta(suite_id: str, condition: str, index: int, anchor: int | None, settings: dict | None = None) -> dict:
    info = {"id": suite_id, "condition": condition, "index": index, "anchor": anchor}
    if settings:
        info.update(settings)
    return {"suite": info}


@dataclass(frozen=True, slots=True)
class Resumed:
    """What a suite already holds, read before a re-run: its settings, the (task, condition,
    index) slots that have a complete run, and each task's anchor."""

    settings: dict
    done: frozenset
    anchors: dict
    runs: list


def read_suite(store, suite_id: str) -> Resumed:
    """The suite `suite_id` of a store as a re-run resumes it; SuiteError if it is not there."""
    ids = suite_ids(store)
    if suite_id not in ids:
        held = ", ".join(ids) if ids else "none"
        raise SuiteError(f"no suite {suite_id!r} in the database to resume (it holds: {held})")
    settings: dict = {}
    runs = []
    for run in store.runs():
        info = run.meta.get("suite") if isinstance(run.meta, dict) else None
        if not isinstance(info, dict) or info.get("id") != suite_id:
            continue
        if not settings and isinstance(info.get("settings"), dict):
            settings = info["settings"]
        r = read_run(store, run)
        if r is not None:
            runs.append(r)
    complete = [r for r in runs if r.status == "complete"]
    anchors: dict = {}
    for r in sorted(complete, key=lambda r: (r.index, r.run_id)):
        if r.condition == "free":
            anchors.setdefault(r.task, r.run_id)
    return Resumed(settings, frozenset((r.task, r.condition, r.index) for r in complete), anchors, complete)


def read_run(store, run) -> SuiteRun | None:
    """A stored run as a suite run, or None if it belongs to no suite."""
    info = run.meta.get("suite") if isinstance(run.meta, dict) else None
    if not isinstance(info, dict) or info.get("condition") not in CONDITIONS or not isinstance(run.task, str):
        return None
    program = info.get("agent") == "program" and isinstance(info.get("task"), str)
    task = info["task"] if program else run.task  # a program's run is `program:NAME`; its suite task is here
    tools = [e.value for e in store.events(run.id, kind="tool")]
    passed = run.outcome.get("passed") if isinstance(run.outcome, dict) else None
    index = info.get("index") if isinstance(info.get("index"), int) else 0
    setup = store.event_at(run.id, site(SETUP_STEP, "setup"))
    tree = setup.value.get("tree") if setup is not None and isinstance(setup.value, dict) else None
    settings = info.get("settings") if isinstance(info.get("settings"), dict) else {}
    label = settings.get("label") if isinstance(settings.get("label"), str) else None
    calls = tuple(json.dumps(e.value, sort_keys=True, default=str) for e in store.events(run.id, kind="message")) \
        if program else None
    actions = state_actions(tools)
    if program:  # the program's own command is the same text every run: its end tree tells them apart
        actions = state_actions([{**v, "cmd": f"{v.get('cmd')} -> {str(v.get('tree_after'))[:16]}"}
                                 if isinstance(v, dict) and "program" in v else v for v in tools])
    return SuiteRun(run.id, task, info["condition"], index, run.status, passed, actions,
                    run.seed if isinstance(run.seed, int) else None, tree if isinstance(tree, str) else None, label,
                    calls)


CANCEL_POLL_S = 0.05  # how often a run waiting for its generation looks at the suite's cancel


class Interrupted(KeyboardInterrupt):
    """The suite's Ctrl-C, raised in a run's own thread from the generation it was waiting
    for: the run ends there, stored as incomplete, as `tttr record` ends on Ctrl-C."""


class _Interruptible:
    """The runtime as a suite's runs use it: a generation also ends when the suite is
    cancelled (the sequence is dropped from the engine and `Interrupted` raised), so that a
    Ctrl-C does not wait for every run in flight to finish its step."""

    def __init__(self, runtime, cancel: threading.Event):
        self._runtime = runtime
        self._cancel = cancel

    def __getattr__(self, name: str):
        return getattr(self._runtime, name)

    @property
    def generate(self):
        return self.generate_in(self._runtime.kernel_mode)

    def generate_in(self, mode: str):
        from tttr.kernels.mode import check_mode, kernel_mode

        mode = check_mode(mode)

        def generate(seq):
            if self._cancel.is_set():
                raise Interrupted("the suite was interrupted")
            engine = self._runtime.engine
            with kernel_mode(mode):
                future = engine.submit(seq)
            while not self._cancel.wait(CANCEL_POLL_S):
                if future.done():
                    return future.result()
            engine.cancel(seq)
            raise Interrupted("the suite was interrupted")

        return generate


def run_suite(
    db: str,
    tasks: list[str],
    runs: int,
    *,
    runtime,
    temperature: float,
    max_steps: int,
    batch: int = 8,
    unsafe_no_sandbox: bool = False,
    suite_id: str | None = None,
    label: str | None = None,
    resume: bool = False,
    task_dirs: list[str] | None = None,
    seed: int | None = None,
    clock: datetime | None = None,
    progress: Callable[[Finished], None] | None = None,
    cancel: threading.Event | None = None,
) -> tuple[str, list[SuiteRun]]:
    """Record the suite into `db`; the suite id and the runs that finished (complete or not).

    `seed`: the free runs' seeds follow from it (`free_seed`), so that two suites given the
    same one pair their runs for `tttr compare`; otherwise each free run gets a fresh seed.
    `clock`: the free runs' start clock instead of the machine's (with `seed`, two suites' runs
    then start from the same trees and pair run by run).
    `resume`: `suite_id` is in `db` already (an interrupted suite); only the (task, condition,
    index) slots without a complete run are run, the pinned ones replaying the anchors it has.

    Ctrl-C (KeyboardInterrupt, raised on again once the runs in flight have ended): runs not
    begun are not begun, and each run in flight ends at once, stored as incomplete (one that
    is running a command ends when the command does). A second Ctrl-C stops waiting for
    them: their runs are marked incomplete from here."""
    from tttr.engine.replay.agent import AgentLimits
    from tttr.engine.replay.runs import record, replay
    from tttr.sessions.store import Store

    suite_id = suite_id or new_suite_id()
    limits = AgentLimits(max_steps=max_steps)
    cancel = cancel or threading.Event()
    runtime = _Interruptible(runtime, cancel)
    settings = {"settings": {"tasks": list(tasks), "runs": runs, "temperature": temperature,
                             "max_steps": max_steps, "label": label, "seed": seed,
                             "clock": clock.isoformat() if clock is not None else None,
                             "task_dirs": [str(Path(d).absolute()) for d in task_dirs or ()]}}
    Store.open(db, create=True).close()  # created and migrated once, before the threads open it
    before = Resumed({}, frozenset(), {}, [])
    if resume:
        with Store.open(db, create=False) as store:
            before = read_suite(store, suite_id)
    total = sum((t, c, i) not in before.done for t in tasks for c in CONDITIONS for i in range(runs))
    finished: list[SuiteRun] = []
    lock = threading.Lock()
    stores: set = set()  # the stores of the runs in flight

    def one(task: str, condition: str, index: int, anchor: int | None) -> SuiteRun | None:
        with lock:
            if cancel.is_set():
                return None
            store = Store.open(db, create=False)
            stores.add(store)
        meta = _suite_meta(suite_id, condition, index, anchor, settings)
        try:
            if condition == "free":
                res = record(store, task, runtime=runtime, temperature=temperature, limits=limits,
                             seed=None if seed is None else free_seed(seed, task, index),
                             clock=clock or _now_utc(), unsafe_no_sandbox=unsafe_no_sandbox, cancel=cancel, meta=meta)
            else:
                res = replay(store, anchor, FREED[condition], runtime=runtime, cancel=cancel,
                             unsafe_no_sandbox=unsafe_no_sandbox, meta=meta)
            if res.run_id is None:
                return None
            return read_run(store, store.run(res.run_id))
        finally:
            with lock:
                stores.discard(store)
            store.close()

    def report(task, condition, index, run, error=None):
        with lock:
            if run is not None:
                finished.append(run)
            done = len(finished) if error is None else len(finished) + 1
            if progress is not None:
                progress(Finished(done, total, task, condition, index, run, error))

    def phase(jobs: list[tuple[str, str, int, int | None]]) -> None:
        """The jobs, `batch` at a time, each in a daemon thread: nothing a run is doing can
        keep the process from exiting once the suite gives up on it."""
        todo: queue.SimpleQueue = queue.SimpleQueue()
        results: queue.SimpleQueue = queue.SimpleQueue()
        for job in jobs:
            todo.put(job)

        def worker() -> None:
            while True:
                try:
                    job = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    results.put((job, one(*job), None))
                except BaseException as exc:  # noqa: BLE001 - reported by the suite's thread
                    results.put((job, None, exc))

        threads = [threading.Thread(target=worker, name="tttr-suite-run", daemon=True)
                   for _ in range(max(1, min(batch, len(jobs))))]
        for t in threads:
            t.start()
        try:
            for _ in jobs:
                (task, condition, index, _), run, exc = results.get()
                if isinstance(exc, Interrupted):
                    continue
                if exc is not None:  # one failed run is reported; the suite goes on
                    report(task, condition, index, None, f"{type(exc).__name__}: {exc}")
                elif run is not None:
                    report(task, condition, index, run)
        except KeyboardInterrupt:
            cancel.set()  # runs not begun are not begun; the ones in flight end now, incomplete
            try:
                for t in threads:
                    t.join()
            except KeyboardInterrupt:  # again: stop waiting; mark the runs still in flight incomplete
                with lock:
                    left = list(stores)
                for store in left:
                    store.close()
            raise

    phase([(t, "free", i, None) for t in tasks for i in range(runs) if (t, "free", i) not in before.done])
    anchors = dict(before.anchors)
    for r in sorted(finished, key=lambda r: (r.index, r.run_id)):
        if r.condition == "free" and r.status == "complete":
            anchors.setdefault(r.task, r.run_id)
    phase([(t, c, i, anchors[t]) for c in FREED for t in tasks if t in anchors and not cancel.is_set()
           for i in range(runs) if (t, c, i) not in before.done])
    return suite_id, finished


# ---------------------------------------------------------------------------- statistics

@dataclass(frozen=True, slots=True)
class TaskStats:
    task: str  # or "overall"
    by_condition: dict[str, Outcomes]
    decomposition: Decomposition


@dataclass(frozen=True, slots=True)
class SuiteStats:
    suite_id: str
    tasks: list[TaskStats]
    overall: TaskStats
    left_out: int  # runs of the suite that are not complete

    def to_json(self) -> dict:
        def task_json(t: TaskStats) -> dict:
            conds = {}
            for c, o in t.by_condition.items():
                iv = o.interval
                conds[c] = {"runs": o.runs, "passed": o.passed, "pass_rate": o.pass_rate,
                            "pass_interval_95": [iv.low, iv.high] if iv else None,
                            "pairs": o.agreement.pairs, "agreeing_pairs": o.agreement.agreeing,
                            "agreement": o.agreement.fraction, "outcome_agreement": o.verdicts.fraction,
                            "model_call_agreement": o.calls.fraction if o.calls.pairs else None}
            return {"task": t.task, "conditions": conds, "decomposition": t.decomposition.to_json()}

        return {"suite": self.suite_id, "tasks": [task_json(t) for t in self.tasks],
                "overall": task_json(self.overall), "incomplete_runs_left_out": self.left_out,
                "residual_ok": self.overall.decomposition.residual_ok
                and all(t.decomposition.residual_ok for t in self.tasks)}


def suite_ids(store) -> list[str]:
    """The suites recorded in a store, oldest first."""
    seen: dict[str, int] = {}
    for run in store.runs():
        info = run.meta.get("suite") if isinstance(run.meta, dict) else None
        if isinstance(info, dict) and isinstance(info.get("id"), str) and info.get("condition") in CONDITIONS:
            seen.setdefault(info["id"], run.id)
    return sorted(seen, key=seen.get)


def suite_stats(store, suite_id: str | None = None) -> SuiteStats:
    """The statistics of one suite of a store (the latest, unless named); SuiteError if the
    store holds none (or not that one)."""
    ids = suite_ids(store)
    if not ids:
        raise SuiteError("the database holds no suite runs: record some with `tttr suite --runs N --db FILE`")
    if suite_id is None:
        suite_id = ids[-1]
    elif suite_id not in ids:
        raise SuiteError(f"no suite {suite_id!r} in the database: it holds {', '.join(ids)}")
    return stats_of(suite_id, suite_runs(store, suite_id))


def suite_runs(store, suite_id: str) -> list[SuiteRun]:
    """Every run of one suite (complete or not), in the store's order."""
    runs = []
    for run in store.runs():
        info = run.meta.get("suite") if isinstance(run.meta, dict) else None
        if isinstance(info, dict) and info.get("id") == suite_id:
            r = read_run(store, run)
            if r is not None:
                runs.append(r)
    return runs


def suite_labels(store) -> dict[str, str | None]:
    """Each suite of a store (oldest first) and its label (None where it has none)."""
    labels: dict[str, str | None] = {i: None for i in suite_ids(store)}
    for run in store.runs():
        info = run.meta.get("suite") if isinstance(run.meta, dict) else None
        settings = info.get("settings") if isinstance(info, dict) else None
        if isinstance(settings, dict) and isinstance(settings.get("label"), str) and info.get("id") in labels:
            labels[info["id"]] = labels[info["id"]] or settings["label"]
    return labels


def find_suite(store, key: str | None, where: str) -> str:
    """The suite `key` names in a store: a suite id or a label (None: the store's only suite,
    else its latest). SuiteError in one line if it names none, or a label names several."""
    labels = suite_labels(store)
    if not labels:
        raise SuiteError(f"{where} holds no suite runs: record some with `tttr suite --runs N --db FILE`")
    if key is None:
        return list(labels)[-1]
    if key in labels:
        return key
    named = [i for i, lab in labels.items() if lab == key]
    if len(named) > 1:
        raise SuiteError(f"label {key!r} names {len(named)} suites in {where} ({', '.join(named)}): give a suite id")
    if not named:
        known = ", ".join(f"{i} ({lab})" if lab else i for i, lab in labels.items())
        raise SuiteError(f"no suite or label {key!r} in {where}: it holds {known}")
    return named[0]


def stats_of(suite_id: str, runs: list[SuiteRun]) -> SuiteStats:
    """Pass rates, agreement and decomposition per task and overall, from complete runs only."""
    complete = [r for r in runs if r.status == "complete"]
    tasks = sorted({r.task for r in complete})
    per_task = []
    pooled: dict[str, Outcomes] = {}
    for task in tasks:
        by_cond = {}
        for cond in CONDITIONS:
            these = [r for r in complete if r.task == task and r.condition == cond]
            rs = [(r.passed, r.actions) for r in these]
            if rs:
                calls = [r.calls for r in these] if all(r.calls is not None for r in these) else None
                by_cond[cond] = outcomes(rs, calls)
                pooled[cond] = pooled[cond] + by_cond[cond] if cond in pooled else by_cond[cond]
        per_task.append(TaskStats(task, by_cond, decompose(by_cond)))
    overall = TaskStats("overall", pooled, decompose(pooled))
    return SuiteStats(suite_id, per_task, overall, len(runs) - len(complete))
