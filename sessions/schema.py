"""The session database's schema and its numbered migrations.

One SQLite file per session database. `PRAGMA application_id` is 0x54545452 ("TTTR"),
`PRAGMA user_version` is the schema version, and the journal is WAL so that the app can
read while a recorder writes. Every open applies the migrations the file lacks, in order,
in one transaction; a migration is never edited once shipped: a change is a new one.

Tables (current version, 4):

runs      one row per run.
          id INTEGER PRIMARY KEY, task, model_id, kernel_mode, sampling (JSON), seed,
          fingerprint (JSON), status (recording | complete | incomplete | failed),
          outcome (JSON or NULL), created / finished (ISO UTC), meta (JSON),
          parent, fork_seq, fork_site, mutation (JSON) for a fork or replay,
          writer: "boot_id:pid:start_ticks" of the process recording it, NULL once finished.
          name: a person's name for the run (`tttr rename`), NULL until given. Added by
          migration 3.
          A run whose writer is gone reads as `incomplete` (see `sessions.liveness`); a
          writable open also stores that status.

kinds     (code INTEGER PRIMARY KEY, layer, kind): an event's layer and kind share one
          small integer in `events.kind`, so a row never spells them out.

events    id INTEGER PRIMARY KEY = run << 32 | seq. The key is derived from (run, seq) so
          that a run's events are one contiguous rowid range (a window [a, b) is one range
          scan) and appending takes SQLite's fast append path. The view `event_rows`
          spells out run, seq, layer and kind for a person at the sqlite3 prompt.
          step, kind (-> kinds.code),
          pos   the position of a positional site (`<step>:token:<pos>`), else NULL,
          site  NULL when it is the canonical `<step>:<kind>[:<pos>]`, else the site verbatim
                (the partial index `events_site` finds those),
          value compact JSON (TEXT), or a small binary record (BLOB) for the high-volume
                kinds `token` and `logits`: see `sessions.codec`.
          A fork stores only its own events; its seqs start at `fork_seq`, and its parent's
          rows with seq < fork_seq are read in their place. Seqs of a run are dense.

steps     (run, step) PRIMARY KEY, WITHOUT ROWID: first_seq, last_seq, events. Written in
          each step's transaction; turns "events of step s" and "the event at site s:..."
          into a short range scan. Added by migration 2, back-filled from `events`.

step_times (run, step) PRIMARY KEY, WITHOUT ROWID: model_ms, tool_ms, wait_ms (REAL, NULL
          where the step had none): what a step took on the host that recorded it, measured
          with a monotonic clock (see `sessions.timings`). Measurements, not events: a replay,
          a diff or a digest never reads them. Added by migration 4; a file written before it
          has no rows (its timings read as not recorded).

blobs     digest (sha256 hex of the raw bytes) PRIMARY KEY, size (raw bytes),
          codec ("zlib" or "raw" when compressing would not shrink it), data.
          Content-addressed: a value is stored once however many events refer to it.

Nothing in a database is ever executed or unpickled: values are JSON or fixed binary
records, blobs are bytes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when migrating: reading commands start faster without it
    import sqlite_utils

APPLICATION_ID = 0x54545452  # "TTTR"


def _m0001_initial(db: sqlite_utils.Database) -> None:
    db["runs"].create(
        {
            "id": int,
            "task": str,
            "model_id": str,
            "kernel_mode": str,
            "sampling": str,
            "seed": int,
            "fingerprint": str,
            "status": str,
            "outcome": str,
            "created": str,
            "finished": str,
            "parent": int,
            "fork_seq": int,
            "fork_site": str,
            "mutation": str,
            "meta": str,
            "writer": str,
        },
        pk="id",
        not_null={"status", "created"},
    )
    db["kinds"].create({"code": int, "layer": str, "kind": str}, pk="code", not_null={"layer", "kind"})
    db["kinds"].create_index(["layer", "kind"], unique=True)
    db["events"].create(
        {"id": int, "step": int, "kind": int, "pos": int, "site": str, "value": bytes},
        pk="id",
        not_null={"step", "kind"},
    )
    db.execute("CREATE INDEX events_site ON events(site) WHERE site IS NOT NULL")
    db.execute(
        "CREATE VIEW event_rows AS SELECT e.id >> 32 AS run, e.id & 4294967295 AS seq, e.step,"
        " k.layer, k.kind, e.pos, e.site, e.value FROM events e JOIN kinds k ON k.code = e.kind"
    )
    db["blobs"].create(
        {"digest": str, "size": int, "codec": str, "data": bytes},
        pk="digest",
        not_null={"size", "codec", "data"},
    )
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")


def _m0002_steps(db: sqlite_utils.Database) -> None:
    db.execute(
        "CREATE TABLE steps (run INTEGER NOT NULL, step INTEGER NOT NULL,"
        " first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, events INTEGER NOT NULL,"
        " PRIMARY KEY (run, step)) WITHOUT ROWID"
    )
    db.execute(
        "INSERT INTO steps SELECT id >> 32, step, min(id & 4294967295), max(id & 4294967295), count(*)"
        " FROM events GROUP BY id >> 32, step"
    )


def _m0003_run_names(db: sqlite_utils.Database) -> None:
    db.execute("ALTER TABLE runs ADD COLUMN name TEXT")


def _m0004_step_times(db: sqlite_utils.Database) -> None:
    db.execute(
        "CREATE TABLE step_times (run INTEGER NOT NULL, step INTEGER NOT NULL,"
        " model_ms REAL, tool_ms REAL, wait_ms REAL, PRIMARY KEY (run, step)) WITHOUT ROWID"
    )


# Index i holds the migration to version i + 1. Append only.
MIGRATIONS: tuple[Callable[[sqlite_utils.Database], None], ...] = (
    _m0001_initial, _m0002_steps, _m0003_run_names, _m0004_step_times)
SCHEMA_VERSION = len(MIGRATIONS)


def version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection, upto: int = SCHEMA_VERSION) -> int:
    """Bring the database to schema version `upto` in one transaction; returns the version
    it had. The connection must be in autocommit mode (isolation_level=None)."""
    import sqlite_utils

    db = sqlite_utils.Database(conn, execute_plugins=False, recursive_triggers=False)
    conn.execute("BEGIN IMMEDIATE")  # re-read under the write lock: another process may have migrated
    try:
        before = version(conn)
        for number in range(before, upto):
            MIGRATIONS[number](db)
        if upto > before:
            conn.execute(f"PRAGMA user_version = {upto}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return before
