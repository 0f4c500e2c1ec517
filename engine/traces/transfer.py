"""The two verbs a script calls (the CLI is a thin layer over these): runs of a session
database out as traces, and an OTLP/JSON file in as runs. Both check everything first and
then act: a bad run, file or value writes nothing.
"""

from __future__ import annotations

import functools
import gc
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tttr.engine.traces.errors import TraceError
from tttr.engine.traces.spans import Trace


def bulk(fn):
    """`fn` run with Python's cyclic garbage collector held off. A whole trace read, checked,
    built or written makes ~100 objects per span and no cycles, and each of the collector's
    full passes walks every object made so far: at 10,000 spans that was half the time
    (cProfile). Reference counting frees everything as usual; when `fn` returns, its
    temporaries are gone, so the collector's next pass sees only what `fn` gave back."""

    @functools.wraps(fn)
    def held(*args, **kwargs):
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return held


@bulk
def run_traces(db: str, run_ids: list[int], *, content: bool = False) -> list[Trace]:
    """The runs `run_ids` of database `db` as traces, one each, read-only."""
    from tttr.engine.traces.imported import is_imported_run, kept_trace
    from tttr.sessions.store import Store

    out = []
    with Store.open(db, create=False, readonly=True) as store:
        for rid in dict.fromkeys(run_ids):
            run = store.run(rid)
            if run.problem:
                raise TraceError(f"run {rid}: {run.problem}")
            if is_imported_run(run):  # what kind_of asks first, without loading the other kinds' modules
                out.append(kept_trace(store, run, content=content))
            else:
                from tttr.engine.kinds import kind_of
                from tttr.engine.traces.from_run import run_trace

                out.append(run_trace(store, run, kind_of(run), content=content))
    return out


@dataclass(frozen=True, slots=True)
class Exported:
    trace_ids: list[str]
    spans: int


@bulk
def export_file(db: str, run_ids: list[int], path: str | Path, *, content: bool = False) -> Exported:
    """The runs `run_ids` of `db` written as one OTLP/JSON file (`run_traces`, then `write_file`)."""
    traces = run_traces(db, run_ids, content=content)
    return Exported([t.trace_id for t in traces], write_file(traces, path))


@bulk
def write_file(traces: list[Trace], path: str | Path) -> int:
    """Write `traces` as OTLP/JSON to `path` (a whole file or none: written beside it, then
    renamed); the number of spans."""
    from tttr.engine.traces.otlp_json import to_bytes

    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise TraceError(f"cannot write {str(path)[:120]}: its folder {str(folder)[:120]} does not exist")
    if path.is_dir():
        raise TraceError(f"cannot write {str(path)[:120]}: it is a folder; give a file name")
    data = to_bytes(traces)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name[:60]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return sum(len(t.spans) for t in traces)


@dataclass(frozen=True, slots=True)
class Imported:
    run_id: int
    trace_id: str
    spans: int
    model_calls: int
    tool_calls: int
    missing: tuple[str, ...]

    def to_json(self) -> dict:
        return {"run": self.run_id, "trace_id": self.trace_id, "spans": self.spans, "model_calls": self.model_calls,
                "tool_calls": self.tool_calls, "missing": list(self.missing)}


@bulk
def import_file(path: str | Path, db: str | Path, fmt: str = "otlp") -> list[Imported]:
    """Each trace of the OTLP/JSON file `path` as a run of the imported kind in `db` (made if
    missing). The file is read and every trace checked before the database is opened."""
    from tttr.engine.traces.imported import plan_import, write_import
    from tttr.engine.traces.otlp import read_file
    from tttr.sessions.store import Store

    planned = plan_import(read_file(path), fmt, str(path))
    with Store.open(db) as store:
        ids = write_import(store, planned)
    return [Imported(rid, p.trace.trace_id, len(p.trace.spans), p.outcome["model_calls"], p.outcome["tool_calls"],
                     tuple(p.outcome["missing"])) for rid, p in zip(ids, planned)]
