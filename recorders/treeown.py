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
    stack = [os.open(tree, _DIR_FLAGS)]
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
                    is_dir = stat.S_ISDIR(st.st_mode)
                    if (st.st_uid, st.st_gid) != (uid, gid) and (is_dir or st.st_nlink == 1):
                        try:
                            os.chown(e.name, uid, gid, dir_fd=fd, follow_symlinks=False)
                            changed += 1
                        except OSError:
                            pass
                    if is_dir:
                        try:
                            stack.append(os.open(e.name, _DIR_FLAGS, dir_fd=fd))
                        except OSError:
                            pass
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return changed


def tree_bytes(tree: str, stop_above: int | None = None) -> int:
    """Apparent size of the regular files under `tree` (what a snapshot would store), plus
    the directories' own sizes. Stops counting once past `stop_above`. Runs while the
    command may be changing the tree, so it walks by directory descriptor and never
    follows a symlink; entries that vanish during the walk are skipped."""
    total = 0
    try:
        stack = [os.open(tree, _DIR_FLAGS)]
    except OSError:
        return 0
    try:
        while stack:
            fd = stack.pop()
            try:
                with os.scandir(fd) as it:
                    for e in it:
                        try:
                            st = e.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        if stat.S_ISREG(st.st_mode):
                            total += st.st_size
                        elif stat.S_ISDIR(st.st_mode):
                            total += st.st_size
                            try:
                                stack.append(os.open(e.name, _DIR_FLAGS, dir_fd=fd))
                            except OSError:
                                pass
                        if stop_above is not None and total > stop_above:
                            return total
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return total
