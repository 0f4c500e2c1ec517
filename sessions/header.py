"""What is this file? Checked from its first 100 bytes, before SQLite opens it.

Opening a file with SQLite can create `-wal`/`-shm` files beside it and, for a writable
connection, recover or migrate it. A file that is not ours must be refused before that
happens, so the SQLite header is read by hand first. When a write-ahead log with frames or
a hot rollback journal sits beside the file, its header may be stale; then the checks are
left to SQLite (`sessions.opening`).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import StoreError
from .schema import APPLICATION_ID, SCHEMA_VERSION

MAGIC = b"SQLite format 3\x00"
WAL_HEADER = 32


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def pending_writes(path: Path) -> bool:
    """A write-ahead log with frames, or a hot rollback journal: the header may be stale."""
    return _size(f"{path}-wal") > WAL_HEADER or _size(f"{path}-journal") > 0


def newer_error(path: Path, version: int) -> StoreError:
    return StoreError(
        f"{path} was written by a newer tttr (schema version {version}; this tttr reads up to "
        f"{SCHEMA_VERSION}); upgrade tttr to open it"
    )


def _what(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def status(path: Path) -> os.stat_result | None:
    """os.stat of `path`, None if nothing is there; StoreError for a symlink loop or a path
    that cannot be looked at. Never opens it."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise StoreError(
                f"{path} is a symbolic link to {os.readlink(path)!r}, which does not exist; fix the link or pass the file"
            ) from None
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreError(f"{path} is a symbolic link loop (too many levels of links); fix the link or pass the file itself") from None
        raise StoreError(f"cannot look at {path}: {exc.strerror}; check the path and its permissions") from None


def regular_file(path: Path, *, missing_ok: bool = False) -> bool:
    """True if `path` is a regular file (False if absent and missing_ok); StoreError for
    anything else, before anything opens it: opening a FIFO blocks forever, a device may
    never end."""
    st = status(path)
    if st is None:
        if missing_ok:
            return False
        raise StoreError(f"{path} does not exist; check the path (a session database is made by recording a run into it)")
    if not stat.S_ISREG(st.st_mode):
        what = _what(st.st_mode)
        hint = "pass the database file" if what == "a directory" else "pass a session database file"
        raise StoreError(f"{path} is {what}, not a session database; {hint}")
    for suffix in ("-wal", "-shm", "-journal"):  # SQLite opens these beside it
        side = Path(f"{path}{suffix}")
        try:
            st = os.lstat(side)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(
                f"{side} beside the database is {_what(st.st_mode) if not stat.S_ISLNK(st.st_mode) else 'a symbolic link'}, "
                f"not a regular file; SQLite would open it: remove it, or copy {path.name} elsewhere"
            )
    return True


def check(path: Path, *, may_be_new: bool) -> None:
    """Raise StoreError unless `path` is (or, with may_be_new, may become) a TTTR database."""
    regular_file(path)
    try:
        with open(path, "rb") as f:
            head = f.read(100)
        size = path.stat().st_size
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc.strerror}; check its permissions") from None
    pending = pending_writes(path)
    if size == 0:
        if pending or may_be_new:
            return
        raise StoreError(f"{path} is empty, not a TTTR session database; pass a database written by tttr")
    if len(head) < 100 or not head.startswith(MAGIC):
        raise StoreError(
            f"{path} is not a SQLite database (it starts with {head[:16]!r}); "
            "pass a session database written by tttr"
        )
    if pending:
        return
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    header_size_valid = head[24:28] == head[92:96] and pages > 0
    if page_size < 512 or size % page_size or (header_size_valid and size < pages * page_size):
        expected = f"{pages * page_size:,}" if header_size_valid else f"a multiple of {page_size}"
        raise StoreError(
            f"{path} is truncated or corrupt ({size:,} bytes; its header expects {expected}); "
            "restore it from a copy"
        )
    app_id = int.from_bytes(head[68:72], "big")
    version = int.from_bytes(head[60:64], "big")
    if app_id != APPLICATION_ID:
        if size <= page_size and may_be_new:
            return  # one page: SQLite's empty database, nothing in it yet
        raise StoreError(
            f"{path} is a SQLite database but not a TTTR session database (application id {app_id:#x}); "
            "pass a database written by tttr"
        )
    if version > SCHEMA_VERSION:
        raise newer_error(path, version)
