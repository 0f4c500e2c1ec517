"""The session store: runs, their events, and content-addressed blobs in one SQLite file.

Writers (the recorders, through the oracle) begin a run, append events, commit once per
step (one transaction each, so a crash loses at most the step in flight) and finish the
run. Readers (the app, replay, diff) list runs and read events by window, step, layer,
kind or site. A fork is a pointer to its parent and a fork seq; reading it resolves the
parent's prefix without it ever having been copied. See `sessions.schema` for the tables.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import sqlite3
import struct
import threading
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from . import blobs, codec, liveness, opening, run_list, safe_text, schema, timings, values
from .records import Event, Outcome, Run, RunMeta
from .timings import StepTime
from .run_list import RunLink, RunRow
from .vocabulary import KIND_LAYER, KINDS, LAYERS, canonical_site, site_parts
from .errors import StoreError

__all__ = ["Store", "StoreError", "Run", "Event", "Outcome", "RawEvent", "RunLink", "RunRow", "LAYERS", "STATUSES"]

STATUSES = ("recording", "complete", "incomplete", "failed")
NAME_CHARS = 80  # a run's name: one line a person reads in the runs list
_KIND = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")


class RawEvent(NamedTuple):
    """One event row as stored (see `Store.raw_events`): the run that stores it, its kind's
    name, and its columns unchecked (a hand-edited file may hold any type in any of them)."""

    source: int
    kind: str
    step: Any
    pos: Any
    site: Any  # the stored site text, or None when it is the one built from step/kind/pos
    value: Any  # the stored record: bytes (binary token/logits) or JSON text
    row: tuple


_END = 1 << 32  # seqs of a run are below this: events.id = run << 32 | seq
_MASK = _END - 1
_RUN_COLUMNS = (
    "id, task, model_id, kernel_mode, sampling, seed, fingerprint, status, outcome, created,"
    " finished, parent, fork_seq, fork_site, mutation, meta, name, writer"
)
_RUN_FIELDS = tuple(c.strip() for c in _RUN_COLUMNS.split(","))


class _Recording:
    """A run this store is writing: its next seq and the events of the step in flight."""

    __slots__ = ("base", "next_seq", "seed", "rows")

    def __init__(self, run_id: int, next_seq: int, seed: int | None):
        self.base = run_id << 32
        self.next_seq = next_seq
        self.seed = seed
        self.rows: list[tuple] = []


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_name(name: Any) -> str:
    """`name` as a run's name (stripped), or StoreError saying why it cannot be one."""
    if type(name) is not str:
        raise StoreError(f"a run's name is text, not {type(name).__name__}")
    name = name.strip()
    bad = next((c for c in name if not c.isprintable()), None)
    if not name or len(name) > NAME_CHARS or bad is not None:
        why = "is empty" if not name else f"holds the control character {bad!r}" if bad else f"is {len(name)} characters long"
        raise StoreError(f"the name {safe_text.visible(name[:40], newlines=False)!r} {why}; give 1..{NAME_CHARS} "
                         "printable characters on one line")
    return name


def _dumps(value: Any, what: str) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} is not JSON ({exc}); pass a dict of str/int/float/bool/None") from None


def _guarded(method):
    """Turn SQLite's and the decoder's failures on a damaged file into one-line StoreErrors."""

    @functools.wraps(method)
    def wrapper(self: Store, *args, **kwargs):
        with self._lock:
            try:
                return method(self, *args, **kwargs)
            except sqlite3.DatabaseError as exc:
                raise opening.database_error(self.path, exc) from None
            except (struct.error, zlib.error, json.JSONDecodeError) as exc:
                raise StoreError(f"{self.path} holds a value that cannot be decoded ({exc}); the file is damaged, restore it from a copy") from None
            except OverflowError:
                raise StoreError(
                    f"a number given to {method.__name__} is beyond SQLite's integer range; run ids, seqs "
                    f"and limits are 0..{2**63 - 1}"
                ) from None
            except RecursionError:
                raise StoreError(f"{self.path} holds a value nested too deeply to read") from None

    return wrapper


class Store:
    """One session database. Thread-safe; open with `Store.open`."""

    def __init__(self, conn: sqlite3.Connection, path: Path, readonly: bool, file_version: int):
        self._conn = conn
        self.file_version = file_version  # before migration; a read-only store migrates a copy
        self.path = path
        self.readonly = readonly
        self._lock = threading.RLock()
        self._codes: dict[tuple[str, str], int] = {}
        # "STEP:KIND" -> (step, kind, layer) of the positional sites appended lately: `append` reads the
        # next position of a token or logits stream (the two interleaved) without parsing its site again.
        self._streams: dict[str, tuple[int, str, str]] = {}
        self._kinds: dict[int, tuple[str, str]] = {}
        self._chains: dict[int, tuple[int | None, int]] = {}  # run -> (parent, first own seq)
        self._seeds: dict[int, int | None] = {}
        self._recording: dict[int, _Recording] = {}
        self._data_version: int | None = None
        self._load_kinds()

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(cls, path: str | Path, create: bool = True, readonly: bool = False) -> Store:
        """Open (with create, make) a session database and bring its schema up to date.

        readonly: never write to the file; an older schema is migrated in a private copy in
        memory. A file that is missing, not SQLite, truncated, foreign or from a newer tttr
        raises StoreError before SQLite touches it."""
        path = Path(path)
        conn, file_version = opening.connect(path, readonly=readonly, may_be_new=create and not readonly)
        try:
            store = cls(conn, path, readonly, file_version)
            if not readonly:
                store._reap()
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise opening.database_error(path, exc) from None
        return store

    def _reap(self) -> None:
        """Mark runs whose writer process is gone as incomplete, so the file says so too."""
        dead = [
            rid
            for rid, writer in self._conn.execute("SELECT id, writer FROM runs WHERE status = 'recording'")
            if not liveness.alive(writer)
        ]
        if dead:
            marks = ",".join("?" * len(dead))
            self._conn.execute(
                f"UPDATE runs SET status = 'incomplete', writer = NULL WHERE status = 'recording' AND id IN ({marks})",
                dead,
            )

    def _load_kinds(self) -> None:
        for code, layer, kind in self._conn.execute("SELECT code, layer, kind FROM kinds"):
            self._kinds[code] = (layer, kind)
            self._codes[(layer, kind)] = code

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Close; a run this store was recording and did not finish is left incomplete."""
        with self._lock:
            if self._conn is None:
                return
            try:
                if self._recording and not self.readonly:
                    ids = list(self._recording)
                    self._conn.execute(
                        f"UPDATE runs SET status = 'incomplete', writer = NULL, finished = ?"
                        f" WHERE status = 'recording' AND id IN ({','.join('?' * len(ids))})",
                        [_now(), *ids],
                    )
            except sqlite3.DatabaseError:
                pass  # the runs still read as incomplete: their writer is gone once we return
            try:
                if not self.readonly and self._conn.total_changes:
                    # SQLite checkpoints the WAL into the database file only when its last
                    # connection closes; with a reader still open (the app) the runs written
                    # here would live only in the -wal file, and a user who copies the .db
                    # alone to share a run would send it without them. (A connection that
                    # wrote nothing has nothing of its own there: a reader skips it.)
                    self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            except sqlite3.DatabaseError:
                pass  # a busy or damaged file: the WAL still holds every committed run
            finally:
                self._recording.clear()
                self._conn.close()
                self._conn = None

    # ------------------------------------------------------------------ writing
    def _writable(self) -> None:
        if self.readonly:
            raise StoreError(f"{self.path} was opened read-only; open it with Store.open(path) to record")

    @_guarded
    def begin_run(
        self, *, task: str | None = None, model_id: str | None = None, kernel_mode: str | None = None,
        sampling: dict | None = None, seed: int | None = None, fingerprint: dict | None = None,
        parent: int | None = None, fork_seq: int | None = None, fork_site: str | None = None,
        mutation: Any = None, meta: dict | RunMeta | None = None,
    ) -> int:
        """Start a run (status "recording") and return its id. A child run (fork or replay)
        names its parent and where it leaves it: fork_seq, or fork_site (its event's seq)."""
        self._writable()
        if seed is not None and type(seed) is not int:
            raise StoreError(f"seed must be an int or None, not {seed!r}")
        if parent is None:
            if fork_seq is not None or fork_site is not None:
                raise StoreError("fork_seq/fork_site need a parent run; pass parent=RUN_ID")
            first = 0
        else:
            self.run(parent)
            if fork_seq is None:
                if fork_site is None:
                    raise StoreError(f"a child of run {parent} needs fork_seq (0 for a replay) or fork_site")
                event = self.event_at(parent, fork_site)
                if event is None:
                    raise StoreError(f"site {fork_site!r} is not in run {parent}; `tttr events DB {parent} --json` lists its sites")
                fork_seq = event.seq
            have = self.count_events(parent)
            if type(fork_seq) is not int or not 0 <= fork_seq <= have:
                raise StoreError(f"fork_seq {fork_seq!r} is outside run {parent}, which has {have} events; pass 0..{have}")
            first = fork_seq
        cur = self._conn.execute(
            "INSERT INTO runs (task, model_id, kernel_mode, sampling, seed, fingerprint, status, created,"
            " parent, fork_seq, fork_site, mutation, meta, writer) VALUES (?,?,?,?,?,?,'recording',?,?,?,?,?,?,?)",
            (
                task, model_id, kernel_mode, _dumps(sampling or {}, "sampling"), seed,
                _dumps(fingerprint or {}, "fingerprint"), _now(), parent, fork_seq, fork_site,
                _dumps(mutation, "mutation"), _dumps(meta.to_json() if isinstance(meta, RunMeta) else meta or {}, "meta"), liveness.identity(),
            ),
        )
        run_id = cur.lastrowid
        self._recording[run_id] = _Recording(run_id, first, seed)
        self._chains[run_id] = (parent, first)
        self._seeds[run_id] = seed
        return run_id

    def _recorder(self, run_id: int) -> _Recording:
        rec = self._recording.get(run_id)
        if rec is None:
            raise StoreError(f"run {run_id} is not being recorded by this store; append to the id begin_run returned")
        return rec

    def append(self, run_id: int, site: str, value: Any) -> int:
        """Buffer the value consumed at `site` (`2:tool`, `setup:clock`, `2:token:5`) in the
        step in flight; returns its seq. Written by commit_step. The event's step, kind and
        layer are the site's (`vocabulary.site_parts`, `KIND_LAYER`): a site outside the
        grammar, or of a kind outside the vocabulary, is refused (`append_event` writes one)."""
        if type(site) is str:  # a token or logits stream's case: a step and kind seen, the next position
            head, _, tail = site.rpartition(":")
            known = self._streams.get(head)
            if known is not None and tail.isdigit() and tail.isascii() and (tail[0] != "0" or tail == "0"):
                return self._buffer(run_id, known[0], known[2], known[1], site, int(tail), None, value)
        parts = site_parts(site) if type(site) is str else None
        layer = KIND_LAYER.get(parts[1]) if parts is not None else None
        if layer is None:
            why = "is not STEP:KIND or STEP:KIND:POS" if parts is None else f"names the kind {parts[1][:40]!r}, not one of {', '.join(KINDS)}"
            raise StoreError(f"site {str(site)[:60]!r} {why}; "
                             "write it with tttr.sessions.vocabulary.site(step, kind, pos)")
        step, kind, pos = parts
        if pos is not None:
            if len(self._streams) >= 64:  # a few steps' streams are enough
                self._streams.clear()
            self._streams[site[:len(site) - len(str(pos)) - 1]] = (step, kind, layer)
        return self._buffer(run_id, step, layer, kind, site, pos, None, value)  # the site is its parts: stored as pos

    def append_event(self, run_id: int, step: int, layer: str, kind: str, site: str, value: Any) -> int:
        """`append` with the event's step, layer and kind given, not derived from its site:
        for foreign data (an imported or hand-made row whose site or kind is outside the
        grammar). Buffers the event; returns its seq."""
        if type(step) is not int or type(site) is not str:
            raise StoreError(f"step must be an int and site a str, not {step!r} and {site!r}")
        pos, verbatim = codec.split_site(site, step, kind)
        return self._buffer(run_id, step, layer, kind, site, pos, verbatim, value)

    def _buffer(self, run_id: int, step: int, layer: str, kind: str, site: str, pos: int | None,
                verbatim: str | None, value: Any) -> int:
        with self._lock:
            rec = self._recording.get(run_id) or self._recorder(run_id)
            code = self._codes.get((layer, kind))
            if code is None:
                code = self._new_kind(layer, kind)
            try:
                stored = codec.encode(kind, value, rec.seed, step, pos)
            except ValueError as exc:
                raise StoreError(f"the value at site {site} of run {run_id}: {exc}; values are JSON") from None
            seq = rec.next_seq
            rec.next_seq = seq + 1
            rec.rows.append((rec.base + seq, step, code, pos, verbatim, stored))
            return seq

    @_guarded
    def _new_kind(self, layer: str, kind: str) -> int:
        if layer not in LAYERS:
            raise StoreError(f"unknown layer {layer!r}; use one of {', '.join(LAYERS)}")
        if type(kind) is not str or not _KIND.match(kind):
            raise StoreError(f"bad event kind {kind!r}; use a name like token or tool (letters, digits, _ . -)")
        self._conn.execute("INSERT OR IGNORE INTO kinds (layer, kind) VALUES (?, ?)", (layer, kind))
        (code,) = self._conn.execute("SELECT code FROM kinds WHERE layer = ? AND kind = ?", (layer, kind)).fetchone()
        self._codes[(layer, kind)] = code
        self._kinds[code] = (layer, kind)
        return code

    @_guarded
    def commit_step(self, run_id: int) -> None:
        """Write the buffered events in one transaction."""
        rec = self._recorder(run_id)
        rows, rec.rows = rec.rows, []
        if not rows:
            return
        if len({r[1] for r in rows}) == 1:  # the usual case: the step's own events
            groups = [(rows[0][1], rows)]
        else:
            groups = [(step, list(g)) for step, g in itertools.groupby(rows, key=lambda r: r[1])]
        steps = [(run_id, step, g[0][0] & _MASK, g[-1][0] & _MASK, len(g)) for step, g in groups]
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO events VALUES (?,?,?,?,?,?)", rows)
            conn.executemany(
                "INSERT INTO steps VALUES (?,?,?,?,?) ON CONFLICT (run, step) DO UPDATE SET"
                " first_seq = min(first_seq, excluded.first_seq), last_seq = max(last_seq, excluded.last_seq),"
                " events = events + excluded.events",
                steps,
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            rec.next_seq = rows[0][0] & _MASK  # seqs stay dense: the lost step's seqs are reused
            raise

    @_guarded
    def finish_run(self, run_id: int, status: str = "complete", outcome: Outcome | dict | None = None) -> None:
        """Commit what is buffered and set the final status and outcome (an Outcome, or its fields)."""
        self._writable()
        if status not in ("complete", "failed", "incomplete"):
            raise StoreError(f"bad final status {status!r}; use complete, failed or incomplete")
        if run_id in self._recording:
            self.commit_step(run_id)
            del self._recording[run_id]
        elif self.run(run_id).status == "recording":
            raise StoreError(f"run {run_id} is being recorded by another process; let that process finish it")
        self._conn.execute(
            "UPDATE runs SET status = ?, outcome = ?, finished = ?, writer = NULL WHERE id = ?",
            (status, _dumps(outcome.to_json() if isinstance(outcome, Outcome) else outcome, "outcome"), _now(), run_id),
        )

    # ------------------------------------------------------------------ managing runs
    @_guarded
    def rename_run(self, run_id: int, name: str | None) -> None:
        """Give the run a name a person reads in the runs list (None clears it). Only the
        run's row changes; its events and every other run stay as they are."""
        self._writable()
        name = None if name is None else run_name(name)
        self.run(run_id)  # an unknown run fails here, with the ids there are
        self._conn.execute("UPDATE runs SET name = ? WHERE id = ?", (name, run_id))

    @_guarded
    def children(self, run_id: int) -> list[int]:
        """The runs that branch from `run_id` (its forks and replays), by id."""
        return [r for (r,) in self._conn.execute("SELECT id FROM runs WHERE parent = ? AND id != ? ORDER BY id",
                                                 (run_id, run_id))]

    @_guarded
    def delete_run(self, run_id: int) -> None:
        """Delete a run: its row, and the events and step index rows it stored itself. A
        fork reads its parent's events up to its fork seq; those belong to the parent and
        stay. Refused for a run that still has forks or replays (delete them first: their
        events read through it) and for a run being recorded. Blobs stay: they are
        content-addressed and may be shared by other runs."""
        self._writable()
        run = self.run(run_id)
        if run.status == "recording":
            raise StoreError(f"run {run_id} is still being recorded; delete it once its recorder has finished")
        kids = self.children(run_id)
        if kids:
            shown = ", ".join(map(str, kids[:10])) + (" …" if len(kids) > 10 else "")
            raise StoreError(f"run {run_id} has {len(kids)} fork(s) or replay(s) that read its events ({shown}); "
                             f"delete those first, e.g. `tttr delete {kids[0]} --db {self.path}`")
        base = run_id << 32
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("DELETE FROM events WHERE id >= ? AND id < ?", (base, base + _END))
            conn.execute("DELETE FROM steps WHERE run = ?", (run_id,))
            conn.execute("DELETE FROM step_times WHERE run = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._chains.pop(run_id, None)
        self._seeds.pop(run_id, None)

    @_guarded
    def data_version(self) -> int:
        """A number that changes when another connection commits to the file (SQLite's
        `PRAGMA data_version`): the one cheap query a reader polls to follow a live run.
        When it changes, what this store remembers of runs' lineage is read again (a run
        may have been deleted and its id given to a new one)."""
        (version,) = self._conn.execute("PRAGMA data_version").fetchone()
        if version != self._data_version:
            if self._data_version is not None:
                self._chains = {r: c for r, c in self._chains.items() if r in self._recording}
                self._seeds = {r: s for r, s in self._seeds.items() if r in self._recording}
            self._data_version = version
        return version

    # ------------------------------------------------------------------ blobs
    @_guarded
    def put_blob(self, data: bytes) -> str:
        """Store bytes once, compressed; returns their sha256 hex digest."""
        self._writable()
        return blobs.put(self._conn, data)

    @_guarded
    def get_blob(self, digest: str, limit: int = blobs.MAX_BYTES) -> bytes:
        """The blob's bytes; StoreError when it expands beyond `limit` (64 MiB): a small
        blob of a hostile file can expand to gigabytes."""
        return blobs.get(self._conn, digest, self.path, limit)

    @_guarded
    def get_blob_part(self, digest: str, limit: int = 1 << 20) -> blobs.BlobPart:
        """For display: (data, complete, size): at most `limit` bytes of the blob, and whether
        that is all of it, so a viewer can say "too large to show in full" instead of loading it."""
        return blobs.get_part(self._conn, digest, self.path, limit)

    @_guarded
    def collect_blobs(self, *, dry_run: bool = False) -> blobs.Sweep:
        """Remove the blobs no run refers to any more (a deleted run's tool outputs, file
        contents and snapshots that no other run shares); `dry_run` only counts them. Refused
        while a run is being recorded (its recorder may hold a blob whose reference it has not
        written yet). What counts as a reference errs on the side of keeping: see
        `blobs.referenced`. The file does not shrink by itself: SQLite reuses the freed pages
        (`vacuum` returns them to the file system)."""
        self._writable()
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")  # no recorder can start or store a blob until we are done
            live = [r for r, writer in conn.execute("SELECT id, writer FROM runs WHERE status = 'recording'")
                    if r in self._recording or liveness.alive(writer)]
            if live:
                raise StoreError(f"run {live[0]} is being recorded; collect blobs once no run is recording")
            found = blobs.sweep(conn, self.path, dry_run=dry_run)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return found

    @_guarded
    def vacuum(self) -> None:
        """Rebuild the file without its free pages (SQLite's VACUUM: atomic, the file is
        either the old one or the new one)."""
        self._writable()
        self._conn.execute("VACUUM")

    @_guarded
    def has_blob(self, digest: str) -> bool:
        return blobs.has(self._conn, digest)

    # ------------------------------------------------------------------ runs
    def _to_run(self, row: tuple, known: set | None = None) -> Run:
        """A runs row as a Run; `known`: ids known to be in the file (its parent is looked
        up there, not queried: a list of many runs checks them all at once)."""
        fields, problems = values.check_run_fields(dict(zip(_RUN_FIELDS, row)))
        writer = fields.pop("writer")
        fields["outcome"], wrong = Outcome.read(fields["outcome"])
        problems += wrong
        fields["meta"], wrong = RunMeta.read(fields["task"], fields["meta"])
        problems += wrong
        # A fork of the setup step recorded as `-1:clock` reads as `setup:clock`, like its events' sites.
        fields["fork_site"] = canonical_site(fields["fork_site"])
        if isinstance(fields["mutation"], dict) and isinstance(fields["mutation"].get("site"), str):
            fields["mutation"] = {**fields["mutation"], "site": canonical_site(fields["mutation"]["site"])}
        if fields["status"] == "recording" and fields["id"] not in self._recording and not liveness.alive(
                writer if type(writer) is str else None):
            fields["status"] = "incomplete"
        elif fields["status"] not in STATUSES:
            problems.append(f"its status {fields['status'][:40]!r} is not one of {', '.join(STATUSES)}")
        parent = fields["parent"]
        if parent is not None and (parent == fields["id"] or (parent not in known if known is not None else self._conn.execute(
                "SELECT 1 FROM runs WHERE id = ?", (parent,)).fetchone() is None)):
            problems.append(f"its parent run {parent} is not in the file")
        return Run(**fields, problem="; ".join(problems) or None)

    @_guarded
    def runs(self) -> list[Run]:
        """Every run, by id. A list to show reads by window instead: `run_links`, `run_rows`."""
        rows = self._conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id").fetchall()
        known = {row[0] for row in rows}
        return [self._to_run(r, known) for r in rows]

    # ------------------------------------------------------------------ the runs list, by window
    @_guarded
    def count_runs(self) -> int:
        return self._conn.execute("SELECT count(*) FROM runs").fetchone()[0]

    @_guarded
    def model_ids(self) -> list[str]:
        """The models the runs were recorded with, each once (text only)."""
        return [m for (m,) in self._conn.execute(
            "SELECT DISTINCT model_id FROM runs WHERE typeof(model_id) = 'text' ORDER BY model_id")]

    @_guarded
    def run_links(self) -> list[RunLink]:
        """Every run's id, parent and whether it is being recorded, by id: one narrow query,
        enough to order a list of any length as a fork tree before reading any of its rows."""
        links = []
        for rid, parent, writer in self._conn.execute(
                "SELECT id, CASE WHEN typeof(parent) = 'integer' THEN parent END,"
                " CASE WHEN status IS 'recording' THEN coalesce(writer, '') END FROM runs ORDER BY id"):
            recording = writer is not None and (rid in self._recording or liveness.alive(
                writer if type(writer) is str else None))
            links.append(RunLink(rid, parent, recording))
        return links

    @_guarded
    def run_rows(self, ids) -> list[RunRow]:
        """The runs `ids` (in that order; an id not in the file is left out) with their
        steps, events and ancestors, read in a fixed number of queries however many ids."""
        ids = list(dict.fromkeys(i for i in ids if values.is_int(i)))
        if not ids:
            return []
        runs = {}
        rows = run_list.rows_with_ancestors(self._conn, _RUN_COLUMNS, ids)
        known = {row[0] for row in rows}
        for row in rows:
            runs[row[0]] = self._to_run(row, known)
            if row[0] not in self._chains:  # what `_chain` would read, from the row at hand
                self._remember_chain(row[0], row[_RUN_FIELDS.index("parent")], row[_RUN_FIELDS.index("fork_seq")],
                                     row[_RUN_FIELDS.index("seed")])
        listed = [rid for rid in ids if rid in runs]
        segments = {rid: self._segments(rid) for rid in listed}
        tops = run_list.max_steps(self._conn, segments)
        lasts = run_list.last_own_events(self._conn, listed, _END)
        out = []
        for rid in listed:
            last = lasts.get(rid)
            events = self._chain(rid)[1] if last is None else (last & _MASK) + 1
            ancestors, seen, at = [], {rid}, runs[rid].parent
            while at in runs and at not in seen:
                seen.add(at)
                ancestors.append(runs[at])
                at = runs[at].parent
            out.append(RunRow(runs[rid], tops.get(rid, -1) + 1, events, tuple(ancestors)))
        return out

    def run_pages(self, offset: int = 0, limit: int | None = None,
                  window: int = run_list.WINDOW) -> Iterator[list[RunRow]]:
        """The runs in id order from position `offset`, at most `limit`, `window` rows at a
        time (`run_rows` each): a reader prints each window as it comes. Each window is read
        under the store's lock; between windows other threads may use the store."""
        if offset < 0 or (limit is not None and limit < 0) or window < 1:
            raise StoreError(f"offset and limit are >= 0 and window >= 1, not {offset}, {limit} and {window}")
        after, left = None, limit
        while left is None or left > 0:
            ids = self._page_ids(after, offset, window if left is None else min(window, left))
            if not ids:
                return
            rows = self.run_rows(ids)
            if rows:
                yield rows
            after = ids[-1]
            if left is not None:
                left -= len(ids)

    @_guarded
    def _page_ids(self, after: int | None, offset: int, limit: int) -> list[int]:
        return run_list.page_ids(self._conn, after, offset, limit)

    @_guarded
    def run(self, run_id: int) -> Run:
        row = self._conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise self._unknown_run(run_id)
        return self._to_run(row)

    def _unknown_run(self, run_id: Any) -> StoreError:
        lo, hi, n = self._conn.execute("SELECT min(id), max(id), count(*) FROM runs").fetchone()
        has = ("no runs" if lo is None else f"run {lo}" if lo == hi else f"runs {lo}–{hi}" if n == hi - lo + 1
               else f"{n} runs between {lo} and {hi}")  # some deleted: a range would hide the gaps
        return StoreError(f"no run {run_id!r} in {self.path} (it has {has}); `tttr runs {self.path}` lists them")

    def _chain(self, run_id: int) -> tuple[int | None, int]:
        chain = self._chains.get(run_id)
        if chain is None:
            row = self._conn.execute("SELECT parent, fork_seq, seed FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise self._unknown_run(run_id)
            chain = self._remember_chain(run_id, *row)
        return chain

    def _remember_chain(self, run_id: int, parent: Any, fork_seq: Any, seed: Any) -> tuple[int | None, int]:
        # A hand-edited file may hold anything here; `run()` names the problem, reads stay safe.
        parent = parent if values.is_int(parent) else None
        first = fork_seq if parent is not None and values.is_int(fork_seq, 0, _END) else 0
        chain = self._chains[run_id] = (parent, first)
        self._seeds[run_id] = seed if values.is_int(seed) else None
        return chain

    def _segments(self, run_id: int) -> list[tuple[int, int, int]]:
        """[(run that stores them, first seq, end seq)] that make up `run_id`, in seq order."""
        segments = []
        source, end = run_id, _END
        seen = set()
        while source is not None and source not in seen:
            seen.add(source)  # a cycle can only come from a hand-edited file; stop rather than loop
            if source != run_id and source not in self._chains and self._conn.execute(
                    "SELECT 1 FROM runs WHERE id = ?", (source,)).fetchone() is None:
                break  # a parent that is not in the file (`run()` names it as the run's problem)
            parent, first = self._chain(source)
            if first < end:
                segments.append((source, first, end))
            source, end = parent, min(end, first)
            if end <= 0:
                break
        return segments[::-1]

    @_guarded
    def sources(self, run_id: int) -> list[int]:
        """The runs whose stored events make up `run_id`, oldest ancestor first, `run_id`
        last: a fork reads its parent's events up to its fork seq."""
        return [source for source, _, _ in self._segments(run_id)]

    def raw_events(self, run_id: int, batch: int = 2_000) -> Iterator[list[RawEvent]]:
        """The run's events as the file holds them, `batch` rows at a time, in seq order (a
        fork's shared prefix included), neither decoded nor checked: for readers that must
        stay quick on long runs and decode only what they need (`decode_raw`). Each batch is
        read under the store's lock; between batches other threads may use the store."""
        for source, first, end in self._guarded_segments(run_id):
            cursor = self._scan_cursor(source, first, end)
            while rows := self._scan_batch(cursor, source, batch):
                yield rows

    @_guarded
    def _guarded_segments(self, run_id: int) -> list[tuple[int, int, int]]:
        return self._segments(run_id)

    @_guarded
    def _scan_cursor(self, source: int, first: int, end: int) -> sqlite3.Cursor:
        base = source << 32
        return self._conn.execute(
            "SELECT id, step, kind, pos, site, value FROM events WHERE id >= ? AND id < ? ORDER BY id",
            (base + first, base + end))

    @_guarded
    def _scan_batch(self, cursor: sqlite3.Cursor, source: int, batch: int) -> list[RawEvent]:
        kinds = self._kinds
        return [RawEvent(source, kinds.get(r[2], ("?", "?"))[1], r[1], r[3], r[4], r[5], r)
                for r in cursor.fetchmany(batch)]

    @_guarded
    def decode_raw(self, run_id: int, raw: RawEvent) -> Event:
        """The Event that `events()` gives for a row `raw_events` read: decoded and checked,
        what is wrong with it as its `problem`."""
        return self._event(run_id, raw.source, raw.row)

    # ------------------------------------------------------------------ events
    def _kind_codes(self, layer: str | None, kind: str | None) -> list[int]:
        return [c for c, (lay, kin) in self._kinds.items() if layer in (None, lay) and kind in (None, kin)]

    def _event(self, run_id: int, source: int, row: tuple) -> Event:
        """One row as an Event; what is wrong with it (a value that cannot be decoded or does
        not fit its kind, a column of the wrong type) is its `problem`, never an exception."""
        key, step, code, pos, verbatim, stored = row
        seq = key & _MASK
        if code not in self._kinds:
            self._load_kinds()  # another writer added a kind since we opened
        if source not in self._seeds:
            self._chain(source)
        layer, kind = self._kinds.get(code, ("?", "?"))
        problem = None
        if (layer, kind) == ("?", "?"):
            problem = f"its kind code {code!r} is not in the kinds table"
        elif type(layer) is not str or type(kind) is not str:
            layer, kind = str(layer), str(kind)
            problem = "its layer or kind is not text"
        if not values.is_int(step, -(2**31), 2**31):
            problem = problem or f"its step is {step!r:.40}, not an integer"
            step = -1
        if pos is not None and not values.is_int(pos, 0, 2**32):
            problem = problem or f"its position is {pos!r:.40}, not an integer"
            pos = None
        if verbatim is not None and type(verbatim) is not str:
            problem = problem or "its site is not text"
            verbatim = repr(verbatim)[:60]
        site = codec.join_site(step, kind, pos, verbatim)
        if problem:
            return Event(run_id, seq, step, layer, kind, site, None, source, problem)
        value, problem = values.decode_value(kind, stored, self._seeds[source], step, pos)
        return Event(run_id, seq, step, layer, kind, site, value, source, problem)

    def _step_range(self, source: int, step: int) -> tuple[int, int] | None:
        row = self._conn.execute("SELECT first_seq, last_seq FROM steps WHERE run = ? AND step = ?", (source, step)).fetchone()
        if row is None:
            return None
        if not (values.is_int(row[0], 0, _END) and values.is_int(row[1], -1, _END)):
            return (0, _END)  # a damaged index row: scan the whole run rather than trust it
        return (row[0], row[1] + 1)

    @_guarded
    def events(
        self, run_id: int, start: int = 0, stop: int | None = None, *, step: int | None = None,
        layer: str | None = None, kind: str | None = None, limit: int | None = None,
    ) -> list[Event]:
        """Events with start <= seq < stop, optionally of one step/layer/kind, at most limit, by seq."""
        if layer is not None and layer not in LAYERS:
            raise StoreError(f"unknown layer {layer!r}; use one of {', '.join(LAYERS)}")
        if limit is not None and limit < 0:
            raise StoreError(f"limit must be >= 0 or None, not {limit}")
        stop = _END if stop is None else stop
        segments = self._segments(run_id)
        if layer is not None or kind is not None:
            codes = self._kind_codes(layer, kind)
            if not codes:
                self._load_kinds()  # another writer may have added it
                codes = self._kind_codes(layer, kind)
            if not codes:
                return []
            kind_sql = f" AND kind IN ({','.join(map(str, codes))})"
        else:
            kind_sql = ""
        out: list[Event] = []
        for source, first, end in segments:
            lo, hi = max(first, start), min(end, stop)
            sql, args = kind_sql, []
            if step is not None:
                bounds = self._step_range(source, step)
                if bounds is None:
                    continue
                lo, hi = max(lo, bounds[0]), min(hi, bounds[1])
                sql, args = " AND step = ?" + kind_sql, [step]
            if lo >= hi:
                continue
            want = "" if limit is None else f" LIMIT {int(limit) - len(out)}"
            base = source << 32
            rows = self._conn.execute(
                f"SELECT id, step, kind, pos, site, value FROM events WHERE id >= ? AND id < ?{sql} ORDER BY id{want}",
                [base + lo, base + hi, *args],
            )
            out.extend(self._event(run_id, source, r) for r in rows)
            if limit is not None and len(out) >= limit:
                break
        return out

    @_guarded
    def event_at(self, run_id: int, site: str) -> Event | None:
        """The first event consumed at `site` (e.g. "4:token:17"), or None."""
        canonical = site_parts(site)
        codes = []
        if canonical is not None:
            codes = self._kind_codes(None, canonical[1])
            if not codes:
                self._load_kinds()  # another writer may have added it
                codes = self._kind_codes(None, canonical[1])
        for source, first, end in self._segments(run_id):
            base = source << 32
            found = [self._conn.execute(
                "SELECT id, step, kind, pos, site, value FROM events WHERE site = ? AND id >= ? AND id < ?"
                " ORDER BY id LIMIT 1",
                (site, base + first, base + end),
            ).fetchone()]
            if codes:
                step, _, pos = canonical
                bounds = self._step_range(source, step)
                if bounds is not None:
                    found.append(self._conn.execute(
                        "SELECT id, step, kind, pos, site, value FROM events WHERE id >= ? AND id < ?"
                        f" AND step = ? AND kind IN ({','.join(map(str, codes))}) AND pos IS ? AND site IS NULL"
                        " ORDER BY id LIMIT 1",
                        (base + max(first, bounds[0]), base + min(end, bounds[1]), step, pos),
                    ).fetchone())
            found = [row for row in found if row is not None]
            if found:
                return self._event(run_id, source, min(found))
        return None

    @_guarded
    def load_run(self, run_id: int) -> tuple[Run, list[Event]]:
        """A run and all its events, for readers that need every value (replay, fork, diff):
        StoreError naming the run, the site and the problem when any of them is unreadable,
        so that such a reader refuses the run before it writes anything."""
        run = self.run(run_id)
        if run.problem:
            raise StoreError(f"run {run_id}: {safe_text.visible(run.problem, newlines=False)}")
        chain = [a for a, _, _ in self._segments(run_id) if a != run_id]
        for ancestor in chain:
            problem = self.run(ancestor).problem
            if problem:
                raise StoreError(f"run {run_id} shares the events of run {ancestor}, which cannot be read: "
                                 f"{safe_text.visible(problem, newlines=False)}")
        events = self.events(run_id)
        for e in events:
            if e.problem:
                where = "" if e.origin == run_id else f" (recorded by run {e.origin})"
                raise StoreError(f"run {run_id}, site {safe_text.visible(e.site, newlines=False)}{where}: "
                                 f"{safe_text.visible(e.problem, newlines=False)}")
        return run, events

    @_guarded
    def count_events(self, run_id: int) -> int:
        """Committed events, the shared prefix of a fork included (seqs are dense)."""
        _, first = self._chain(run_id)
        base = run_id << 32
        (last,) = self._conn.execute("SELECT max(id) FROM events WHERE id >= ? AND id < ?", (base, base + _END)).fetchone()
        return first if last is None else (last & _MASK) + 1

    @_guarded
    def own_events(self, run_id: int) -> int:
        """Events the run stored itself (a fork's shared prefix is its parent's)."""
        self.run(run_id)  # an unknown run fails here, with the ids there are
        base = run_id << 32
        return self._conn.execute("SELECT count(*) FROM events WHERE id >= ? AND id < ?", (base, base + _END)).fetchone()[0]

    @_guarded
    def steps(self, run_id: int) -> int:
        """Number of agent steps (0..n-1) in the run, the shared prefix of a fork included."""
        top = -1
        for source, first, end in self._segments(run_id):
            (m,) = self._conn.execute(
                "SELECT max(step) FROM steps WHERE run = ? AND first_seq < ? AND last_seq >= ?"
                " AND typeof(step) = 'integer'", (source, end, first)
            ).fetchone()
            if m is not None:
                top = max(top, m)
        return top + 1

    @_guarded
    def step_counts(self, run_id: int, kind: str | None = None) -> dict[int, int]:
        """Events per step (of `kind`, when given), the shared prefix of a fork included,
        counted by SQLite without decoding a value; a step that is not an integer in the file
        counts as the setup step's."""
        self.run(run_id)  # an unknown run fails here, with the ids there are
        kind_sql = ""
        if kind is not None:
            codes = self._kind_codes(None, kind) or (self._load_kinds() or self._kind_codes(None, kind))
            if not codes:
                return {}
            kind_sql = f" AND kind IN ({','.join(map(str, codes))})"
        counts: dict[int, int] = {}
        for source, first, end in self._segments(run_id):
            base = source << 32
            for step, n in self._conn.execute(
                    "SELECT CASE WHEN typeof(step) = 'integer' AND step BETWEEN -2147483648 AND 2147483647"
                    f" THEN step ELSE -1 END AS s, count(*) FROM events WHERE id >= ? AND id < ?{kind_sql} GROUP BY s",
                    (base + first, base + end)):
                counts[step] = counts.get(step, 0) + n
        return counts

    # ------------------------------------------------------------------ step timings
    @_guarded
    def time_step(self, run_id: int, step: int, *, model_ms: float | None = None, tool_ms: float | None = None,
                  wait_ms: float | None = None) -> None:
        """Store what step `step` of the run took (ms; None: the step had no such part), once
        its events are committed. A measurement, not an event: replays and diffs never read it
        (`sessions.timings`). Writing a step again replaces its row."""
        self._writable()
        if type(step) is not int:
            raise StoreError(f"step must be an int, not {step!r}")
        timings.write(self._conn, run_id, step, model_ms, tool_ms, wait_ms)

    @_guarded
    def step_times(self, run_id: int) -> list[StepTime]:
        """The run's step timings by step (a fork's steps before its fork point are its
        parent's); [] when none were recorded (an older file, an imported trace)."""
        self.run(run_id)  # an unknown run fails here, with the ids there are
        return timings.read(self._conn, self._segments(run_id))

    # ------------------------------------------------------------------ the file
    @_guarded
    def stats(self) -> dict:
        """Figures for `tttr info`."""
        q = lambda sql: self._conn.execute(sql).fetchone()  # noqa: E731 - a one-line local helper
        statuses = {s: 0 for s in STATUSES}
        unreadable = 0
        for run in self.runs():
            statuses[run.status] = statuses.get(run.status, 0) + 1
            unreadable += run.problem is not None
        blobs, raw, stored = q("SELECT count(*), coalesce(sum(size), 0), coalesce(sum(length(data)), 0) FROM blobs")
        return {
            "path": str(self.path),
            "schema_version": self.file_version,
            "reads_as_version": schema.version(self._conn),
            "journal_mode": q("PRAGMA journal_mode")[0],
            "page_size": q("PRAGMA page_size")[0],
            "file_bytes": self.path.stat().st_size,
            "runs": sum(statuses.values()),
            "statuses": statuses,
            "unreadable_runs": unreadable,
            "events": q("SELECT count(*) FROM events")[0],
            "blobs": blobs,
            "blob_bytes": raw,
            "blob_stored_bytes": stored,
        }

    @_guarded
    def check(self) -> list[str]:
        """SQLite's quick_check: [] when the file is sound, else the problems it found."""
        problems = [r[0] for r in self._conn.execute("PRAGMA quick_check")]
        return [] if problems == ["ok"] else problems
