"""A triage's or bisect's replays as Ray tasks: `tttr triage ... --ray [ADDRESS]`, `tttr bisect
... --ray [ADDRESS]` (issue 30).

The experiment is decided where it is asked for (engine/replay/triage.py, bisect.py and
engine/program/triage.py, unchanged: which subsets to test, in which rounds, and whether a
round's tests go side by side), and only where a test runs changes: each test is a Ray task
that replays into a copy of the database as it was when the experiment began (one snapshot,
`ray.put` once) on whichever worker Ray picks, and returns its trial and the copy. The
driver merges each copy's new run into the database (`sessions.merge`, the snapshot's runs
known: the replay's parent is the run it already holds) one at a time, and gives the trial
its id there. A round's tests side by side are threads that each wait on their own Ray task,
so they run on as many workers as the cluster has; a test whose worker dies is run again by
Ray (a replay of a snapshot is safe to repeat). So the report is the local one's: the same
subsets tested, the same verdicts; only the stored runs' ids (and `merged_from` in their meta)
differ. Ctrl-C, or a test raising in a batch, cancels the tests in flight and starts no more:
unlike the local path, where they end as incomplete runs, nothing of them is stored (a test
that returned already is merged, complete).

A worker keeps what it loaded (the built-in agent's runtime, a program's shared model) for
the tests it runs next.
"""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

_LOADED: dict = {}  # a worker process's runtimes and shared models, kept between the tests it runs
POLL_S = 0.2


def _agent_trial(snapshot: bytes, base: int, other: int, subset: list, judge, model: str | None, kernel_mode: str,
                 unsafe_no_sandbox: bool):
    """On a worker: the built-in agent's test (engine/replay/trial.py's `apply`) in a copy of the database."""
    from tttr.engine.replay.deltas import Pair
    from tttr.engine.replay.runtime import Runtime
    from tttr.engine.replay.trial import apply
    from tttr.sessions.store import Store

    key = ("agent", model or "", kernel_mode)
    if key not in _LOADED:
        _LOADED[key] = Runtime(model, kernel_mode=kernel_mode)
    runtime = _LOADED[key]
    with tempfile.TemporaryDirectory(prefix="tttr-test-") as tmp:
        db = Path(tmp) / "copy.db"
        db.write_bytes(snapshot)
        with Store.open(db, create=False) as store, runtime.reusing_prefixes():
            trial = apply(store, Pair.load(store, base, other), subset, judge, runtime=runtime,
                          unsafe_no_sandbox=unsafe_no_sandbox)
        return trial, _closed_bytes(db)


def _program_trial(snapshot: bytes, base: int, other: int, subset: list, judge, check: str | None,
                   model: str | None, unsafe_no_sandbox: bool):
    """On a worker: a recorded program's test (engine/program/triage.py's `apply`) in a copy of the database."""
    from tttr.engine.program.deltas import ProgramPair
    from tttr.engine.program.triage import Setup, SharedModel, apply
    from tttr.sessions.store import Store

    with tempfile.TemporaryDirectory(prefix="tttr-test-") as tmp:
        db = Path(tmp) / "copy.db"
        db.write_bytes(snapshot)
        with Store.open(db, create=False, readonly=True) as store:
            pair = ProgramPair.load(store, base, other)
        key = ("program", model or "", pair.base.run.model_id)
        if key not in _LOADED:
            _LOADED[key] = SharedModel(model, pair.base.run.model_id)
        trial = apply(str(db), base, subset, Setup(pair, judge, [], check), model=model,
                      unsafe_no_sandbox=unsafe_no_sandbox, live=_LOADED[key])
        return trial, _closed_bytes(db)


def _closed_bytes(db: Path) -> bytes:
    from tttr.sessions.store import Store

    Store.open(db, create=False).close()  # its WAL checkpointed into the file
    for suffix in ("-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    return db.read_bytes()


def _snapshot(db: str) -> bytes:
    """The database as it is now, whole (SQLite's backup: consistent while others hold it open)."""
    import sqlite3

    with tempfile.TemporaryDirectory(prefix="tttr-snapshot-") as tmp:
        copy = Path(tmp) / "snapshot.db"
        src, dst = sqlite3.connect(f"file:{db}?mode=ro", uri=True), sqlite3.connect(copy)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()
        return copy.read_bytes()


def _not_stopped(stop: threading.Event | None) -> None:
    """A test asked for once the experiment was stopped is not started (KeyboardInterrupt)."""
    if stop is not None and stop.is_set():
        raise KeyboardInterrupt


class RayTests:
    """An experiment's tests on Ray, into `db`: `agent(...)` and `program(...)` each run one
    test as a Ray task and return its trial, merged into `db`. Any thread may call them."""

    def __init__(self, db: str, address: str | None, *, init_kwargs: dict | None = None):
        from tttr.engine.replay.ray_suite import _ray, check_address, start_ray, worker_env
        from tttr.sessions.store import Store

        check_address(address)
        self.ray = _ray()
        self.db, self.where = db, address or "a local Ray instance"
        with Store.open(db, create=False, readonly=True) as store:
            self.known = {(0, r.id): r.id for r in store.runs()}
        data = _snapshot(db)
        env = worker_env()
        start_ray(address, runtime_env={"env_vars": env} if env else None, **(init_kwargs or {}))
        self.snapshot = self.ray.put(data)
        self._agent = self.ray.remote(num_cpus=1)(_agent_trial)
        self._program = self.ray.remote(num_cpus=1)(_program_trial)
        self._lock = threading.Lock()  # one merge at a time

    def noted(self, out):
        """`out` (a Triage or Bisect), its batch note saying where its replays ran."""
        out.batch_note = f"{out.batch_note}; each replay a Ray task on {self.where}, merged into {Path(self.db).name}"
        return out

    def agent(self, base: int, other: int, subset: list, judge, *, model: str | None, kernel_mode: str,
              unsafe_no_sandbox: bool, stop: threading.Event | None = None):
        _not_stopped(stop)
        ref = self._agent.remote(self.snapshot, base, other, list(subset), judge, model, kernel_mode,
                                 unsafe_no_sandbox)
        return self._merged(ref, subset, stop)

    def program(self, base: int, other: int, subset: list, judge, *, check: str | None, model: str | None,
                unsafe_no_sandbox: bool, stop: threading.Event | None = None):
        _not_stopped(stop)
        ref = self._program.remote(self.snapshot, base, other, list(subset), judge, check, model, unsafe_no_sandbox)
        return self._merged(ref, subset, stop)

    def _merged(self, ref, subset: list, stop: threading.Event | None):
        """The test's trial once its Ray task returns, its run merged into the database. Ctrl-C
        or `stop` cancels the task (KeyboardInterrupt): nothing of it is stored."""
        from tttr.sessions.merge import merge

        ray = self.ray
        try:
            while not ray.wait([ref], timeout=POLL_S)[0]:
                if stop is not None and stop.is_set():
                    raise KeyboardInterrupt
            trial, data = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:  # raised on the worker (a refusal, a bug): raised here as itself
            cause = getattr(exc, "cause", None)
            raise (cause if isinstance(cause, Exception) else exc) from None
        except BaseException:
            ray.cancel(ref, force=True)
            raise
        with self._lock, tempfile.TemporaryDirectory(prefix="tttr-merge-") as tmp:
            part = Path(tmp) / "test.db"
            part.write_bytes(data)
            merged = merge([part], self.db, append=True, known=self.known)
        trial.run_id = merged.run_ids.get((0, trial.run_id)) if trial.run_id is not None else None
        trial.deltas = list(subset)  # the caller's own deltas (ddmin keys its cache on them)
        return trial
