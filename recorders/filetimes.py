"""File times in virtual time. The kernel stamps what a command writes with the real
clock, which libfaketime cannot reach; afterwards, every time in the tree that falls in
the command's real-time window is set to the step's virtual clock (clamped, as with
SOURCE_DATE_EPOCH). Times a command set on purpose (`touch -d`) fall outside the window
and are kept. ctime cannot be set and stays real."""

from __future__ import annotations

import os

SLACK_NS = 50_000_000  # kernel timestamps are coarse-grained: widen the window a little


def clamp_times(tree: str, since_ns: int, until_ns: int, epoch: int) -> int:
    """Set atime/mtime in [since, until] to `epoch` for every entry under `tree` (and the
    tree itself). Returns how many entries were changed."""
    lo, hi = since_ns - SLACK_NS, until_ns + SLACK_NS
    target = epoch * 1_000_000_000
    changed = 0

    def fix(path: str, st: os.stat_result) -> None:
        nonlocal changed
        a, m = st.st_atime_ns, st.st_mtime_ns
        na = target if lo <= a else a  # reads after the command (our own walk) count too
        nm = target if lo <= m <= hi else m
        if (na, nm) != (a, m):
            try:
                os.utime(path, ns=(na, nm), follow_symlinks=False)
                changed += 1
            except OSError:
                pass

    def walk(path: str) -> None:
        try:
            it = os.scandir(path)
        except OSError:
            return
        with it:
            for entry in it:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    walk(entry.path)
                    st = os.lstat(entry.path)  # its own times may have moved while walking
                fix(entry.path, st)

    walk(tree)
    fix(tree, os.lstat(tree))
    return changed
