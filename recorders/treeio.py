"""Host-side reads and writes of a tree that an untrusted program controls.

TTTR's host side runs as root (CI's case and many containers) beside a tree that a sandboxed
program writes while it runs, or that a shared database describes. Anything done there by
path can be turned: a symlink planted at a name (or swapped in between a check and a use)
sends a read or a write to any host file, and a FIFO or a device blocks or never ends.

So every access here is relative to a directory descriptor, one component at a time, with
O_NOFOLLOW: a directory is opened with O_DIRECTORY | O_NOFOLLOW, a file with O_NOFOLLOW |
O_NONBLOCK and then checked with `fstat` (a regular file, or it is not read), reads stop at
a bound, and writes create new names with O_EXCL and rename them over the old ones inside
the same directory. A walk never recurses in Python (a tree nested 1,000 deep is data, not a
crash) and stops at MAX_DEPTH, a limit it names.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from tttr.recorders.errors import SnapshotError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 512                  # directories below a tree's root; one descriptor each while walked
MAX_FILE_BYTES = 1 << 30         # one file read at most (a sparse file can claim terabytes)
CHUNK = 1 << 20


def open_root(tree: str) -> int:
    """A descriptor of the tree's own directory (a path TTTR chose or the user gave; its last
    component must not be a link)."""
    try:
        return os.open(tree, DIR_FLAGS)
    except OSError as exc:
        raise SnapshotError(f"cannot open tree {tree!r}: {exc.strerror}") from None


@contextmanager
def opened_root(tree: str):
    fd = open_root(tree)
    try:
        yield fd
    finally:
        os.close(fd)


def walk(root_fd: int, max_depth: int = MAX_DEPTH) -> Iterator[tuple[int, str, str, os.stat_result]]:
    """(directory descriptor, relative path, name, lstat) of every entry under the tree, in
    the order a sorted depth-first walk meets them (a directory before what it holds, names
    sorted in each directory). The descriptor is the entry's parent's, valid until the next
    item is asked for. Entries that vanish are skipped; a directory that cannot be opened
    (swapped for a link meanwhile) is listed and not entered."""
    stack: list[tuple[int, str, Iterator]] = [(root_fd, "", iter(_listing(root_fd, "")))]
    try:
        while stack:
            fd, rel_dir, items = stack[-1]
            item = next(items, None)
            if item is None:
                stack.pop()
                if fd != root_fd:
                    os.close(fd)
                continue
            name, st = item
            rel = f"{rel_dir}/{name}" if rel_dir else name
            yield fd, rel, name, st
            if stat.S_ISDIR(st.st_mode):
                if len(stack) > max_depth:
                    raise SnapshotError(f"the tree is nested deeper than {max_depth} directories (at {rel[:200]!r}…): "
                                        "TTTR's snapshots stop there; flatten it")
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue
                stack.append((child, rel, iter(_listing(child, rel))))
    finally:
        for fd, _, _ in stack:
            if fd != root_fd:
                os.close(fd)


def _listing(fd: int, rel: str) -> list[tuple[str, os.stat_result]]:
    try:
        with os.scandir(fd) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError as exc:
        raise SnapshotError(f"cannot read directory {rel or '.'!r}: {exc.strerror}") from None
    out = []
    for e in entries:
        try:
            out.append((e.name, e.stat(follow_symlinks=False)))
        except OSError:
            continue
    return out


def open_regular(dir_fd: int, name: str) -> tuple[int, os.stat_result] | None:
    """(descriptor, fstat) of `name` in `dir_fd` if it is a regular file, else None (a link,
    a FIFO, a device, a socket, a directory, or gone)."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd, st


def read_regular(dir_fd: int, name: str, *, keep: bool, limit: int = MAX_FILE_BYTES,
                 rel: str | None = None) -> tuple[str, bytes | None, int, os.stat_result] | None:
    """(sha256, bytes if `keep`, size, fstat) of regular file `name`, or None when it is not one.
    SnapshotError when it holds more than `limit` bytes."""
    opened = open_regular(dir_fd, name)
    if opened is None:
        return None
    fd, st = opened
    h, parts, size = hashlib.sha256(), [], 0
    try:
        while True:
            chunk = os.read(fd, CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise SnapshotError(f"file {rel or name!r} holds more than {limit:,} bytes, the most a snapshot reads")
            h.update(chunk)
            if keep:
                parts.append(chunk)
    except OSError as exc:
        raise SnapshotError(f"cannot read file {rel or name!r}: {exc.strerror}") from None
    finally:
        os.close(fd)
    return h.hexdigest(), (b"".join(parts) if keep else None), size, st


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


def lstat_beneath(tree: str, rel: str) -> os.stat_result | None:
    """lstat of `rel` inside `tree`, reached one directory at a time without following a
    link; None when it is missing or a component on the way is not a directory."""
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        return None
    try:
        fd = open_root(tree)
    except SnapshotError:
        return None
    try:
        for part in parts[:-1]:
            try:
                nxt = open_dir(fd, part)
            except OSError:
                return None
            os.close(fd)
            fd = nxt
        return lstat_at(fd, parts[-1])
    finally:
        os.close(fd)


class NotRegularFile(OSError):
    """`write_beneath`'s entry is there and is not a regular file (a link, a folder, a FIFO)."""


def write_beneath(tree: str, rel: str, data: bytes) -> None:
    """Set the bytes of the file at `rel` ("/"-separated, checked by the caller: no "..")
    inside `tree`, reached one directory at a time without following a link, and written as
    `write_file_at` writes (a fresh name renamed over it); an existing file keeps its mode, a
    new one is 0o644. NotRegularFile where the entry is something else; OSError otherwise."""
    *folders, name = rel.split("/")
    fds = [open_root(tree)]
    try:
        for folder in folders:
            fds.append(open_dir(fds[-1], folder))
        st = lstat_at(fds[-1], name)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{rel}: not a regular file")
        write_file_at(fds[-1], name, data, st.st_mode if st is not None else 0o644)
    finally:
        for fd in fds:
            os.close(fd)


def open_dir(dir_fd: int, name: str) -> int:
    """A descriptor of subdirectory `name` (never through a link)."""
    return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


class DirCache:
    """Descriptors of a tree's directories by relative path, each opened from its parent's
    with O_NOFOLLOW; closed together."""

    def __init__(self, root_fd: int):
        self.fds: dict[str, int] = {".": root_fd}
        self.root_fd = root_fd

    def get(self, rel: str) -> int:
        fd = self.fds.get(rel)
        if fd is None:
            parent, _, name = rel.rpartition("/")
            fd = open_dir(self.get(parent or "."), name)
            self.fds[rel] = fd
        return fd

    def forget(self, rel: str) -> None:
        """Close the descriptors of `rel` and what lies under it (it was removed or replaced)."""
        for key in [k for k in self.fds if k == rel or k.startswith(rel + "/")]:
            if key != ".":
                os.close(self.fds.pop(key))

    def close(self) -> None:
        for key, fd in self.fds.items():
            if key != ".":
                os.close(fd)
        self.fds = {".": self.root_fd}


REMOVE_DEPTH = 64  # directories held open while removing; deeper ones are moved up first


def remove_at(dir_fd: int, name: str) -> None:
    """Remove entry `name` of `dir_fd`, a directory with all it holds, never through a link
    and without recursion (shutil.rmtree recurses in Python: a tree nested 1,000 deep made it
    raise RecursionError). A directory deeper than REMOVE_DEPTH is first renamed to the top
    level, so that at most that many descriptors are open at once."""
    st = lstat_at(dir_fd, name)
    if st is None:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    pending = [name]
    while pending:
        frames = [(dir_fd, pending.pop(), None)]
        while frames:
            parent, nm, items = frames[-1]
            if items is None:
                try:
                    fd = open_dir(parent, nm)
                except FileNotFoundError:
                    frames.pop()
                    continue
                with os.scandir(fd) as it:
                    listing = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
                frames[-1] = (parent, nm, (fd, iter(listing)))
                continue
            fd, it = items
            entry = next(it, None)
            if entry is None:
                os.close(fd)
                frames.pop()
                os.rmdir(nm, dir_fd=parent)
                continue
            child, is_dir = entry
            if not is_dir:
                os.unlink(child, dir_fd=fd)
            elif len(frames) < REMOVE_DEPTH:
                frames.append((fd, child, None))
            else:
                moved = f".tttr-rm-{secrets.token_hex(8)}"
                os.rename(child, moved, src_dir_fd=fd, dst_dir_fd=dir_fd)
                pending.append(moved)


def remove_tree(path: str | os.PathLike) -> bool:
    """Remove `path` and everything under it (see remove_at), as cleanup does: absent is
    fine, and a failure is reported by returning False, never raised."""
    parent, _, name = os.path.abspath(path).rpartition("/")
    try:
        pfd = os.open(parent or "/", DIR_FLAGS)
    except OSError:
        return False
    try:
        remove_at(pfd, name)
        return True
    except OSError:
        return False
    finally:
        os.close(pfd)


def write_file_at(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """Put a regular file holding `data` at `name`: written under a fresh name made with
    O_EXCL (so nothing planted there is followed), then renamed over `name` in one step."""
    for _ in range(16):
        tmp = f".tttr-{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, NEW_FLAGS, 0o600, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:
        raise SnapshotError(f"cannot make a temporary file beside {name!r}")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode & 0o7777)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    try:
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:
        os.unlink(tmp, dir_fd=dir_fd)
        raise


def chmod_dir_at(dir_fd: int, name: str, mode: int) -> None:
    fd = open_dir(dir_fd, name)
    try:
        os.fchmod(fd, mode & 0o7777)
    finally:
        os.close(fd)


def set_time_at(dir_fd: int, name: str, ns: int) -> None:
    os.utime(name, ns=(ns, ns), dir_fd=dir_fd, follow_symlinks=False)
