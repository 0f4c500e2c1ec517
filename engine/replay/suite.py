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
import queue
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from tttr.engine.replay.suite_runs import (  # noqa: F401 - also this module's names, as before the split
    Resumed, SuiteError, SuiteRun, find_suite, read_run, read_suite, suite_ids, suite_labels, suite_runs,
)
from tttr.engine.replay.suite_stats import SuiteStats, TaskStats, stats_of, suite_stats  # noqa: F401
from tttr.engine.replay.variance import CONDITIONS

# The layers each replayed condition computes live (the tensor layer: with invariant kernels).
FREED = {"token-pinned": ("tensor", "trace"), "trace-pinned": ("tensor", "token"), "pinned": ("tensor",)}


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
    retry: str | None = None  # a shard run again (its worker died): why, and which attempt; nothing stored


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
