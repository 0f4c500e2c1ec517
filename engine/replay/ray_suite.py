"""A suite fanned out over Ray: `tttr suite ... --ray [ADDRESS]` (issue 30).

The suite is sharded by task: one Ray task per suite task runs `run_suite` for that task alone
(its free runs, then the replays of its anchor, `--batch` at a time through one engine) into
a database of its own on the worker, and returns the file. The driver merges each file into
the suite's database as it arrives (`sessions.merge`), so a shard that dies half way leaves
nothing in it: its database dies with it (or is left in the worker's temporary folder), never
read. The driver runs a shard whose worker or node died again, elsewhere if Ray will
(`SHARD_RETRIES` times, each said on the progress line: `Finished.retry`), rather than Ray's
silent `max_retries`; a shard that raised (the user's mistake, a bug) is not run again. A worker process keeps
its model loaded between the shards it runs. The seeds of free runs follow from `--seed`
(task, index), so the runs are those of the single-machine suite given the same seed.

`ray.init()` starts a local instance when no address is given; an address joins an existing
cluster (checked first: one that does not answer is refused in one line). With `--resume`, each
shard starts from a copy of the suite's database, and only its new runs are merged back.
Ray is an optional extra (`pip install tttr[ray]`).
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from datetime import datetime
from pathlib import Path
from typing import Callable

_RUNTIMES: dict = {}  # a worker process's loaded models, kept between the shards it runs
SHARD_RETRIES = 2


def _error(text: str):
    from tttr.engine.replay.suite import SuiteError

    return SuiteError(text)


def check_address(address: str | None) -> None:
    """A cluster address answers on its port (a TCP connect, 3 s), before Ray is asked."""
    if not address or address in ("auto", "local"):
        return
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise _error(f"--ray {address!r}: give HOST:PORT of a running Ray head (e.g. 10.0.0.5:6379), or no address "
                     "to start one here")
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError as exc:
        raise _error(f"--ray {address!r}: nothing answers there ({exc.strerror or exc}): start the cluster "
                     "(`ray start --head`) or give its address") from None


def _ray():
    try:
        import ray
    except ImportError:
        raise _error("--ray needs Ray: pip install 'tttr[ray]' (or pip install ray)") from None
    return ray


RAYLET_WAIT_S = "120"  # Ray's default (10 s) is too short for a local start on a loaded 2-core machine


def start_ray(address: str | None = None, **kwargs) -> None:
    """`ray.init` (a local instance, or joining `address`); one line if Ray does not come up."""
    ray = _ray()
    os.environ.setdefault("RAY_raylet_start_wait_time_s", RAYLET_WAIT_S)
    try:
        ray.init(address=address or None, ignore_reinit_error=True, log_to_driver=False, **kwargs)
    except Exception as exc:  # noqa: BLE001 - Ray's own error, said in one line
        raise _error(f"--ray {address or '(local)'}: Ray did not start or join: {str(exc).splitlines()[0][:200]}") \
            from None


def worker_env() -> dict:
    """The driver's settings a worker needs too: the task folders and the default model."""
    from tttr.recorders.tasks import TASKS_PATH_ENV

    return {k: os.environ[k] for k in (TASKS_PATH_ENV, "TTTR_MODEL") if k in os.environ}


def _runtime(model: str | None):
    from tttr.engine.replay.runtime import Runtime

    key = model or ""
    if key not in _RUNTIMES:
        _RUNTIMES[key] = Runtime(model, kernel_mode="invariant")
    return _RUNTIMES[key]


def run_shard(task: str, snapshot: bytes | None, settings: dict) -> bytes:
    """On a worker: the suite's runs of `task` into a database of its own; its bytes."""
    from tttr.engine.replay.suite import run_suite
    from tttr.recorders.tasks import use_task_dirs

    if settings.get("task_dirs"):
        use_task_dirs(settings["task_dirs"])
    with tempfile.TemporaryDirectory(prefix="tttr-shard-") as tmp:
        db = Path(tmp) / "shard.db"
        if snapshot is not None:
            db.write_bytes(snapshot)
        if settings.get("program"):
            _program_shard(str(db), task, snapshot is not None, settings)
            return _closed_bytes(db)
        run_suite(str(db), [task], settings["runs"], runtime=_runtime(settings["model"]),
                  temperature=settings["temperature"], max_steps=settings["max_steps"], batch=settings["batch"],
                  unsafe_no_sandbox=settings["unsafe_no_sandbox"], suite_id=settings["suite_id"],
                  label=settings["label"], resume=snapshot is not None, task_dirs=settings["task_dirs"],
                  seed=settings["seed"], clock=datetime.fromisoformat(settings["clock"]) if settings["clock"] else None)
        return _closed_bytes(db)


def _closed_bytes(db: Path) -> bytes:
    for suffix in ("-wal", "-shm"):  # every connection is closed: the file holds it all
        Path(str(db) + suffix).unlink(missing_ok=True)
    return db.read_bytes()


def _program_shard(db: str, task: str, resume: bool, settings: dict) -> None:
    """A program's suite for one task on this worker: the program must be here (on PATH, and
    the files its command line names in the driver's folder), else one line."""
    import shutil

    from tttr.engine.replay.program_suite import program_files, run_program_suite

    argv, cwd = settings["program"], Path(settings["cwd"])
    if "/" not in argv[0] and shutil.which(argv[0]) is None or "/" in argv[0] and not (cwd / argv[0]).exists():
        raise _error(f"program {argv[0]!r} is not on worker {socket.gethostname()}: install it there")
    named = [a for a in argv[1:] if a.endswith((".py", ".sh", ".js")) and not Path(a).is_absolute()]
    missing = [a for a in named if a not in program_files(argv, cwd)]
    if missing:
        raise _error(f"{', '.join(missing)} not found in {cwd} on worker {socket.gethostname()}: "
                     "give the cluster a shared folder, or run the program's suite on this machine")
    run_program_suite(db, [task], settings["runs"], argv, model=settings["model"], timeout_s=settings["timeout_s"],
                      unsafe_no_sandbox=settings["unsafe_no_sandbox"], suite_id=settings["suite_id"],
                      label=settings["label"], resume=resume, task_dirs=settings["task_dirs"], seed=settings["seed"],
                      cwd=cwd, clock=datetime.fromisoformat(settings["clock"]) if settings["clock"] else None)


def _file_bytes(db: str) -> bytes:
    from tttr.sessions.store import Store

    Store.open(db, create=False).close()  # its WAL checkpointed into the file
    return Path(db).read_bytes()


def run_suite_on_ray(
    db: str, tasks: list[str], runs: int, *, model: str | None, temperature: float, max_steps: int, batch: int = 8,
    unsafe_no_sandbox: bool = False, suite_id: str, label: str | None = None, resume: bool = False,
    task_dirs: list[str] | None = None, seed: int | None = None, clock=None, address: str | None = None,
    program: list[str] | None = None, timeout_s: float = 600.0,
    progress: Callable | None = None, cancel: threading.Event | None = None, init_kwargs: dict | None = None,
):
    """The suite over Ray into `db` (see the module's note); the suite id and its runs that
    arrived, as `run_suite` returns them."""
    from tttr.engine.replay.suite import Finished, read_run
    from tttr.sessions.merge import merge
    from tttr.sessions.store import Store

    check_address(address)
    ray = _ray()
    Store.open(db, create=True).close()
    snapshot = _file_bytes(db) if resume else None
    known: dict = {}
    if snapshot is not None:
        with Store.open(db, create=False, readonly=True) as store:
            known = {(0, r.id): r.id for r in store.runs()}
    settings = {"runs": runs, "model": model, "temperature": temperature, "max_steps": max_steps, "batch": batch,
                "unsafe_no_sandbox": unsafe_no_sandbox, "suite_id": suite_id, "label": label,
                "task_dirs": [str(Path(d).absolute()) for d in task_dirs or ()], "seed": seed,
                "clock": clock.isoformat() if clock is not None else None,
                "program": list(program) if program else None, "cwd": str(Path.cwd()), "timeout_s": timeout_s}
    env = worker_env()
    start_ray(address, runtime_env={"env_vars": env} if env else None, **(init_kwargs or {}))
    shard = ray.remote(max_retries=0, num_cpus=1)(run_shard)  # retried here, where the retry is seen
    snap_ref = ray.put(snapshot) if snapshot is not None else None
    pending = {shard.remote(t, snap_ref, settings): t for t in tasks}
    attempts = dict.fromkeys(tasks, 1)
    finished = []
    total = len(tasks) * runs * 4
    try:
        while pending:
            if cancel is not None and cancel.is_set():
                raise KeyboardInterrupt
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            if not done:
                continue
            ref = done[0]
            task = pending.pop(ref)
            try:
                data = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if getattr(cause, "exit_code", None) is not None:  # the user's mistake, seen on a worker
                    for other in pending:
                        ray.cancel(other, force=True)
                    raise _error(f"on a worker: {cause}") from None
                if progress is not None:
                    progress(Finished(len(finished) + 1, total, task, "all", 0, None,
                                      f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"))
                continue
            except Exception as exc:  # noqa: BLE001 - its worker or node died: again, or said and the rest go on
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                if attempts[task] <= SHARD_RETRIES:
                    attempts[task] += 1
                    pending[shard.remote(task, snap_ref, settings)] = task
                    if progress is not None:
                        progress(Finished(len(finished), total, task, "all", 0, None,
                                          retry=f"its worker died ({why}); running it again, attempt "
                                                f"{attempts[task]} of {SHARD_RETRIES + 1}"))
                    continue
                if progress is not None:
                    progress(Finished(len(finished) + 1, total, task, "all", 0, None,
                                      f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"))
                continue
            with tempfile.TemporaryDirectory(prefix="tttr-merge-") as tmp:
                part = Path(tmp) / f"{task[:60]}.db"
                part.write_bytes(data)
                res = merge([part], db, append=True, known=known)
            new = sorted(v for k, v in res.run_ids.items() if k not in known)
            with Store.open(db, create=False, readonly=True) as store:
                for rid in new:
                    r = read_run(store, store.run(rid))
                    if r is None:
                        continue
                    finished.append(r)
                    if progress is not None:
                        progress(Finished(len(finished), total, r.task, r.condition, r.index, r))
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    return suite_id, finished
