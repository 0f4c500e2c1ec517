"""Merging session databases into one: every run of each source, its events and steps as
stored, its blobs once (`tttr merge`, and the Ray fan-out's driver, issue 30).

- **Ids remapped.** Runs get new ids in the target, in source order; a child's `parent`
  follows its parent, and a suite run's `meta.suite.anchor` its anchor. Events are keyed by
  (run << 32 | seq), so they move with their run; seqs, steps and sites are unchanged. Each
  run's meta gains `merged_from: {db, run}` (the source's file name and its id there). Ids
  inside event values (a tool value's `reused_from`) keep naming the source's run.
- **Blobs de-duplicated** by digest: a blob the target holds is not copied again.
- **Step timings** (`step_times`) move with their run, as its steps do.
- **Event kinds** are small integers per file; they are remapped by (layer, kind).
- **Suites and labels kept**: a suite keeps its id and its label (in each run's meta).
- **Refused, nothing written**, in one line: a source that is not a session database, one of
  another schema version than this tttr's, a suite that two databases label differently, a
  label that two databases give to different suites, a target that exists (unless `append`).
- **Atomic**: a new target is written to a temporary file beside it and renamed into place; an
  appended target takes every source in one transaction. A run a source was still recording
  arrives as `incomplete`, never as recording.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from . import schema, timings
from .errors import StoreError
from .records import RunMeta


class MergeError(StoreError):
    pass


@dataclass(frozen=True, slots=True)
class Merged:
    runs: int
    events: int
    blobs_added: int
    blobs_shared: int
    run_ids: dict  # (source index, id there) -> id in the target


def _labels(conn: sqlite3.Connection) -> dict[str, str | None]:
    """suite id -> its label (None when it has none), from the runs' meta."""
    out: dict[str, str | None] = {}
    for (column,) in conn.execute("SELECT meta FROM runs"):
        suite = RunMeta.of(None, _meta(column)).suite
        if suite is not None and suite.id is not None:
            out[suite.id] = out.get(suite.id) or suite.label
    return out


def _read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to a checked session database of this schema version."""
    from .store import Store

    with Store.open(path, create=False, readonly=True) as store:  # not ours, damaged, newer: refused here
        version = store.file_version
    if version != schema.SCHEMA_VERSION:
        raise MergeError(f"{path} has schema version {version}, this tttr writes {schema.SCHEMA_VERSION}: "
                         f"upgrade it first by opening it writable once (e.g. `tttr rename --db {path} ...` or "
                         "recording into it), then merge")
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, isolation_level=None)
    conn.execute("PRAGMA trusted_schema = OFF")
    return conn


def _check_labels(named: list[tuple[str, dict[str, str | None]]]) -> None:
    by_suite: dict[str, tuple[str, str]] = {}
    by_label: dict[str, tuple[str, str]] = {}
    for where, labels in named:
        for suite, label in labels.items():
            if label is None:
                continue
            if suite in by_suite and by_suite[suite][0] != label:
                raise MergeError(f"suite {suite} is labelled {by_suite[suite][0]!r} in {by_suite[suite][1]} and "
                                 f"{label!r} in {where}: merge them apart, or relabel one")
            if label in by_label and by_label[label][0] != suite:
                raise MergeError(f"label {label!r} names suite {by_label[label][0]} in {by_label[label][1]} and "
                                 f"suite {suite} in {where}: a merged database could not tell them apart")
            by_suite.setdefault(suite, (label, where))
            by_label.setdefault(label, (suite, where))


def merge(sources: list[str | Path], into: str | Path, *, append: bool = False, known: dict | None = None) -> Merged:
    """Copy every run of `sources` into `into` (see the module's note); MergeError (one line,
    nothing written) for what it refuses. `known`: {(source index, run id): target run id} for
    runs the target holds already (a worker's database that began as a copy of it): they are
    not copied again, and a parent or anchor that names them follows the mapping."""
    from .store import Store

    target = Path(into)
    paths = [Path(s) for s in sources]
    if not paths:
        raise MergeError("give at least one database to merge")
    if target.exists() and not append:
        raise MergeError(f"{target} exists: give a new file with --into, or --append to add to it")
    if any(p.resolve() == target.resolve() for p in paths if p.exists()):
        raise MergeError(f"{target} is also a source: merge into another file")
    conns = []
    try:
        for p in paths:
            conns.append(_read_only(p))
        named = [(str(p), _labels(c)) for p, c in zip(paths, conns)]
        if append and target.exists():
            with Store.open(target, create=False) as _:  # checked, migrated, its dead writers reaped
                pass
            t = _read_only(target)
            try:
                named.insert(0, (str(target), _labels(t)))
            finally:
                t.close()
        _check_labels(named)
    finally:
        for c in conns:
            c.close()

    if append and target.exists():
        if len(paths) > ATTACH_AT_ONCE:
            raise MergeError(f"--append takes at most {ATTACH_AT_ONCE} databases at once (one transaction); "
                             f"got {len(paths)}: append them in groups")
        return _copy(paths, target, known or {})
    tmp = target.with_name(f".{target.name}.merging-{os.getpid()}")
    try:
        Store.open(tmp, create=True).close()
        res = _copy(paths, tmp, known or {})
        os.replace(tmp, target)  # its connection is closed: the WAL is checkpointed into it
        return res
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(str(tmp) + suffix).unlink(missing_ok=True)


ATTACH_AT_ONCE = 8  # SQLite attaches at most 10 databases to one connection by default


def _copy(paths: list[Path], target: Path, known: dict) -> Merged:
    """Every source into `target`, ATTACH_AT_ONCE sources per transaction."""
    conn = sqlite3.connect(str(target), isolation_level=None)
    conn.execute("PRAGMA trusted_schema = OFF")
    conn.execute("PRAGMA busy_timeout = 5000")
    conn.execute("CREATE TEMP TABLE rmap (old INTEGER PRIMARY KEY, new INTEGER NOT NULL)")
    conn.execute("CREATE TEMP TABLE kmap (old INTEGER PRIMARY KEY, new INTEGER NOT NULL)")
    run_ids: dict = {}
    events = runs = added = shared = 0
    try:
        for first in range(0, len(paths), ATTACH_AT_ONCE):
            chunk = list(enumerate(paths))[first:first + ATTACH_AT_ONCE]
            for j, (_, path) in enumerate(chunk):
                conn.execute(f"ATTACH DATABASE ? AS s{j}", (f"{path.resolve().as_uri()}?mode=ro",))
            try:
                conn.execute("BEGIN IMMEDIATE")
                for j, (i, path) in enumerate(chunk):
                    src = f"s{j}"
                    conn.execute("DELETE FROM rmap")
                    conn.execute("DELETE FROM kmap")
                    _map_kinds(conn, src)
                    runs += _copy_runs(conn, src, path.name, i, run_ids, known)
                    events += conn.execute(
                        "INSERT INTO main.events (id, step, kind, pos, site, value)"
                        " SELECT (m.new << 32) | (e.id & 4294967295), e.step, k.new, e.pos, e.site, e.value"
                        f" FROM {src}.events e JOIN rmap m ON m.old = (e.id >> 32) JOIN kmap k ON k.old = e.kind"
                    ).rowcount
                    conn.execute("INSERT INTO main.steps (run, step, first_seq, last_seq, events)"
                                 " SELECT m.new, s.step, s.first_seq, s.last_seq, s.events"
                                 f" FROM {src}.steps s JOIN rmap m ON m.old = s.run")
                    timings.copy(conn, src)
                    total = conn.execute(f"SELECT count(*) FROM {src}.blobs").fetchone()[0]
                    new = conn.execute("INSERT OR IGNORE INTO main.blobs (digest, size, codec, data)"
                                       f" SELECT digest, size, codec, data FROM {src}.blobs").rowcount
                    added, shared = added + new, shared + total - new
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            finally:
                for j in range(len(chunk)):
                    conn.execute(f"DETACH DATABASE s{j}")
    finally:
        conn.close()
    return Merged(runs, events, added, shared, run_ids)


def _map_kinds(conn: sqlite3.Connection, src: str) -> None:
    """kmap: the source's kind codes -> the target's, adding the kinds the target lacks."""
    have = {(layer, kind): code for code, layer, kind in conn.execute("SELECT code, layer, kind FROM main.kinds")}
    top = max(have.values(), default=0)
    for code, layer, kind in conn.execute(f"SELECT code, layer, kind FROM {src}.kinds").fetchall():
        new = have.get((layer, kind))
        if new is None:
            top += 1
            new = have[(layer, kind)] = top
            conn.execute("INSERT INTO main.kinds (code, layer, kind) VALUES (?, ?, ?)", (new, layer, kind))
        conn.execute("INSERT INTO kmap (old, new) VALUES (?, ?)", (code, new))


RUN_COLUMNS = ("task", "model_id", "kernel_mode", "sampling", "seed", "fingerprint", "status", "outcome", "created",
               "finished", "parent", "fork_seq", "fork_site", "mutation", "meta", "writer", "name")


def _copy_runs(conn: sqlite3.Connection, src: str, db_name: str, index: int, run_ids: dict, known: dict) -> int:
    """The source's runs, in id order (a parent before its children), as new rows; rmap filled."""
    cols = ", ".join(RUN_COLUMNS)
    rows = conn.execute(f"SELECT id, {cols} FROM {src}.runs ORDER BY id").fetchall()
    mapped: dict[int, int] = {}
    at = {c: k for k, c in enumerate(RUN_COLUMNS)}
    copied = 0
    for old, *values in rows:
        if (index, old) in known:  # the target holds it: not copied, but named through the mapping
            mapped[old] = run_ids[(index, old)] = known[(index, old)]
            continue
        copied += 1
        values = list(values)
        parent = values[at["parent"]]
        if parent is not None:
            if parent not in mapped:
                raise MergeError(f"run {old} of {db_name} names parent {parent!r}, which it does not hold: "
                                 "check the file with `tttr info`")
            values[at["parent"]] = mapped[parent]
        meta = _meta(values[at["meta"]])
        if meta is not None:  # else kept as the source has it
            suite = RunMeta.of(None, meta).suite
            if suite is not None and suite.anchor in mapped:
                meta["suite"] = {**meta["suite"], "anchor": mapped[suite.anchor]}
            meta["merged_from"] = {"db": db_name, "run": old}
            values[at["meta"]] = json.dumps(meta, separators=(",", ":"))
        if values[at["status"]] == "recording":  # half-written there: never recording here
            values[at["status"]] = "incomplete"
        values[at["writer"]] = None
        new = conn.execute(f"INSERT INTO main.runs ({cols}) VALUES ({', '.join('?' * len(RUN_COLUMNS))})",
                           values).lastrowid
        mapped[old] = new
        run_ids[(index, old)] = new
        conn.execute("INSERT INTO rmap (old, new) VALUES (?, ?)", (old, new))
    return copied


def _meta(text) -> dict | None:
    """A run's meta as a dict, or None when it is not one (copied untouched then)."""
    if text is None:
        return {}
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except (ValueError, RecursionError):  # nested past what json reads: copied untouched
        return None
    return value if isinstance(value, dict) else None
