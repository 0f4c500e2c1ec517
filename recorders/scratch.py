"""Temporary directories that name the process that made them, so that those of a process
killed with SIGKILL (which never ran its cleanup) are found and removed by the next.

`scratch_dir("tttr-run-")` makes `<tmp>/tttr-run-<pid>-XXXXXXXX`; the first call for a
(folder, prefix) in a process removes the directories with that prefix whose pid is dead.
They are removed with recorders/treeio.remove_tree, at any depth (a program's tree may nest
deeper than shutil.rmtree's recursion can go), never through a link.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from tttr.recorders.treeio import remove_tree

_swept: set[tuple[str, str]] = set()


def scratch_dir(prefix: str, base: str | None = None) -> Path:
    """A new private directory `<base>/<prefix><pid>-XXXXXXXX` (base: the default temporary
    folder). The caller removes it when done; if it is killed first, a later process does."""
    folder = base or tempfile.gettempdir()
    if (folder, prefix) not in _swept:
        _swept.add((folder, prefix))
        sweep(prefix, folder)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=folder))


def sweep(prefix: str, folder: str) -> list[str]:
    """Remove the directories `<folder>/<prefix><pid>-*` that this uid owns and whose pid is
    dead. A pid alive again (reused) keeps its directories. Returns the names removed."""
    removed = []
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        pid, dash, _ = name[len(prefix):].partition("-")
        if not (pid.isdigit() and dash) or pid_alive(int(pid)):
            continue
        try:
            st = os.lstat(os.path.join(folder, name))
        except OSError:
            continue
        # a shared /tmp: never a link, never another user's directory
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            remove_tree(os.path.join(folder, name))
            removed.append(name)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether a process `pid` exists (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
