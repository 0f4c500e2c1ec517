"""File times in virtual time. The kernel stamps what a command writes with the real
clock, which libfaketime cannot reach; afterwards, every time in the tree that falls in
the command's real-time window is set to the step's virtual clock (clamped, as with
SOURCE_DATE_EPOCH). Times a command set on purpose (`touch -d`) fall outside the window
and are kept. ctime cannot be set and stays real.

The walk is treeown's: by directory descriptor, never following a link, without
recursion (any depth), and each time is set relative to the directory it was found in.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from tttr.recorders.treeown import _DIR_FLAGS, _walk

SLACK_NS = 50_000_000  # kernel timestamps are coarse-grained: widen the window a little


def clamp_times(tree: str, since_ns: int, until_ns: int, epoch: int,
                seen: Callable[[os.stat_result], None] | None = None) -> int:
    """Set atime/mtime in [since, until] to `epoch` for every entry under `tree` (and the
    tree itself). Returns how many times were set (a directory's may be set twice: when it
    is found, and once listed). `seen` is given each entry's lstat before its times are
    set: what else must look at the whole tree after a command looks on the same walk."""
    lo, hi = since_ns - SLACK_NS, until_ns + SLACK_NS
    target = epoch * 1_000_000_000
    try:
        owner = os.lstat(tree).st_uid
    except OSError:
        return 0

    def clamped(st: os.stat_result) -> tuple[int, int] | None:
        a, m = st.st_atime_ns, st.st_mtime_ns
        na = target if lo <= a else a  # reads after the command (our own walk) count too
        nm = target if lo <= m <= hi else m
        return None if (na, nm) == (a, m) else (na, nm)

    def fix_dir(fd: int) -> int:
        """A directory's own times, set through its descriptor once it has been listed (the
        listing itself moves its atime)."""
        try:
            times = clamped(os.fstat(fd))
            if times:
                os.utime(fd, ns=times)
                return 1
        except OSError:
            pass
        return 0

    changed = 0
    current = -1  # the directory whose entries are coming: the walk gives them together
    walk = _walk(tree)
    try:
        for fd, name, st in walk:
            if fd != current:
                current = fd
                changed += fix_dir(fd)
            if seen is not None:
                seen(st)
            # a file hard-linked from outside the tree (another owner) keeps its times
            if not (stat.S_ISDIR(st.st_mode) or st.st_nlink == 1 or st.st_uid == owner):
                continue
            times = clamped(st)
            if times:
                try:
                    os.utime(name, ns=times, dir_fd=fd, follow_symlinks=False)
                    changed += 1
                except OSError:
                    pass
    finally:
        walk.close()
    try:  # the tree itself when it is empty (fixing it twice changes nothing)
        fd = os.open(tree, _DIR_FLAGS)
    except OSError:
        return changed
    try:
        return changed + fix_dir(fd)
    finally:
        os.close(fd)
