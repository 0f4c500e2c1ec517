"""Opening a session database: refuse what is not ours, migrate what is old, set the pragmas.

The header is checked by hand first (`sessions.header`), so a file that is not a TTTR
database is refused before SQLite opens it. A read-only open never writes: an old schema
is migrated in a private copy in memory.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from . import header, schema
from .errors import StoreError

BUSY_MS = 5000
TABLES = {"runs", "kinds", "events", "steps", "step_times", "blobs"}


def connect(path: Path, *, readonly: bool, may_be_new: bool) -> tuple[sqlite3.Connection, int]:
    """An autocommit connection to an up-to-date database, and the schema version the file had."""
    if may_be_new and not header.regular_file(path, missing_ok=True):
        if not path.parent.is_dir():
            raise StoreError(f"cannot create {path}: folder {path.parent} does not exist; create it first")
        if not os.access(path.parent, os.W_OK):
            raise StoreError(f"cannot create {path}: folder {path.parent} is not writable; "
                             "pass a path in a folder you can write to")
    else:
        header.check(path, may_be_new=may_be_new)
    conn = None
    try:
        if readonly:
            uri = f"{path.resolve().as_uri()}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
        else:
            conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
        conn.execute("PRAGMA trusted_schema = OFF")
        file_version = schema.version(conn)
        return _prepare(conn, path, readonly, may_be_new), file_version
    except sqlite3.DatabaseError as exc:
        if conn is not None:
            conn.close()
        raise database_error(path, exc) from None
    except BaseException:
        if conn is not None:
            conn.close()
        raise


def _prepare(conn: sqlite3.Connection, path: Path, readonly: bool, may_be_new: bool) -> sqlite3.Connection:
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = schema.version(conn)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if app_id != schema.APPLICATION_ID:
        if tables:
            shown = ", ".join(sorted(tables)[:5])
            raise StoreError(
                f"{path} is a SQLite database but not a TTTR session database (tables: {shown}); "
                "pass a database written by tttr"
            )
        if not may_be_new:
            raise StoreError(f"{path} is an empty SQLite database, not a TTTR session database; pass a database written by tttr")
    if version > schema.SCHEMA_VERSION:
        raise header.newer_error(path, version)
    if not readonly:  # before migrating, so that even creating the schema is crash-safe through the WAL
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # WAL: a crash of the process loses nothing committed
    if version < schema.SCHEMA_VERSION:
        if readonly:
            copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            conn.backup(copy)
            conn.close()
            conn = copy
        schema.migrate(conn)
    missing = TABLES - {
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    if missing:
        raise StoreError(f"{path} is damaged: table(s) {', '.join(sorted(missing))} are missing; restore it from a copy")
    return conn


def database_error(path: Path, exc: sqlite3.DatabaseError) -> StoreError:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StoreError(f"{path} is locked by another writer (waited {BUSY_MS // 1000} s); try again when it is done")
    folder = path.parent
    cannot_open = "unable to open" in text or "readonly" in text or "read-only" in text
    if cannot_open and not os.access(folder, os.W_OK):
        # SQLite creates <db>-wal and <db>-shm beside a WAL database, even to read it.
        return StoreError(
            f"{path} cannot be opened: its folder {folder} is not writable, and SQLite needs to create "
            f"{path.name}-wal/-shm there even to read it ({text}); the file itself is not known to be "
            "damaged: copy it (with any -wal file) to a writable folder and open the copy"
        )
    if "readonly" in text or "read-only" in text:
        return StoreError(f"{path} cannot be written ({text}); check the permissions of the file and its folder")
    if "unable to open" in text:
        return StoreError(f"{path} cannot be opened ({text}); check the permissions of the file, its folder and any -wal/-shm files beside it")
    return StoreError(f"{path} is corrupt ({text}); restore it from a copy (`tttr info {path}` checks its integrity)")
