"""The task tree as the sandbox's unprivileged user sees it: who owns it, and how big it is.

When TTTR runs as root, the sandbox runs as an unprivileged host uid, so the tree (set up,
restored from a snapshot or edited by root between commands) is handed to that uid before
each command. The walk never follows a symlink (every call is relative to a directory
descriptor opened with O_NOFOLLOW) and never gives away a file with more than one hard
link: a hard link to a host file such as /etc/shadow placed in a tree stays the host's.
"""

from __future__ import annotations

import os
import stat

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _walk(tree: str):
    """(directory descriptor, entry name, lstat) for everything under `tree`, depth first.
    Every call is relative to a directory descriptor opened with O_NOFOLLOW, so a symlink
    is never followed, even one swapped in during the walk; entries that vanish are
    skipped. Closing the generator early closes the descriptors it holds."""
    try:
        stack = [os.open(tree, _DIR_FLAGS)]
    except OSError:
        return
    try:
        while stack:
            fd = stack.pop()
            try:
                with os.scandir(fd) as it:
                    entries = list(it)
                for e in entries:
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    yield fd, e.name, st
                    if stat.S_ISDIR(st.st_mode):
                        try:
                            stack.append(os.open(e.name, _DIR_FLAGS, dir_fd=fd))
                        except OSError:
                            pass
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)


def hand_over(tree: str, uid: int, gid: int) -> int:
    """lchown everything under `tree` (and itself) not yet owned by uid:gid. Returns how
    many entries changed owner. One scandir walk; cheap when nothing changed."""
    changed = 0
    st = os.lstat(tree)
    if not stat.S_ISDIR(st.st_mode):
        return 0
    if (st.st_uid, st.st_gid) != (uid, gid):
        os.chown(tree, uid, gid, follow_symlinks=False)
        changed += 1
    for fd, name, st in _walk(tree):
        if (st.st_uid, st.st_gid) != (uid, gid) and (stat.S_ISDIR(st.st_mode) or st.st_nlink == 1):
            try:
                os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
                changed += 1
            except OSError:
                pass
    return changed


def tree_bytes(tree: str, stop_above: int | None = None) -> int:
    """Apparent size of the regular files under `tree` (what a snapshot would store), plus
    the directories' own sizes. Stops counting once past `stop_above`. Runs while the
    command may be changing the tree, hence the walk by directory descriptor."""
    total = 0
    walk = _walk(tree)
    try:
        for _, _, st in walk:
            if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                total += st.st_size
                if stop_above is not None and total > stop_above:
                    break
    finally:
        walk.close()
    return total
