"""The launcher: a small C program that starts bubblewrap for each command.

When TTTR runs as root, bubblewrap's user namespace would map the agent's user to host
root, and a command could then write host kernel settings under /proc/sys. So, as root,
the launcher drops to an unprivileged host uid/gid (SANDBOX_HOST_UID, overridable with
$TTTR_SANDBOX_UID) before it executes bwrap, and the agent's uid 1000 inside maps to that
uid, never to root. An unprivileged bwrap resolves every bind source as that uid, though,
and the tree or the cache may sit under a directory it cannot search (/root, a 0700
temporary directory); so the launcher first opens the directories the sandbox needs, moves
into a private mount namespace (invisible to the host, gone with the process), mounts a
small tmpfs on STAGE and bind-mounts each opened directory there, then drops its
privileges. bwrap is given the STAGE paths.

It also opens the seccomp program (a file of BPF) onto descriptor SECCOMP_FD for bwrap's
`--seccomp`, which reads it before the command starts.

Its source is recorders/launcher.c, built with the system C compiler on first use, like the
randomness shim.
"""

from __future__ import annotations

import os
from pathlib import Path

from tttr.sessions.cache import build_shared, c_source
from tttr.recorders.errors import SandboxError

STAGE = "/tmp"           # in the launcher's private mount namespace only
SECCOMP_FD = 9
DEFAULT_HOST_UID = 100000


def sandbox_host_uid() -> int:
    """The unprivileged host uid (and gid) the sandbox runs as when TTTR runs as root:
    $TTTR_SANDBOX_UID, else 100000. Pick one that no host user or service owns files as."""
    text = os.environ.get("TTTR_SANDBOX_UID", "")
    if not text:
        return DEFAULT_HOST_UID
    try:
        uid = int(text)
    except ValueError:
        uid = -1
    if not 1 <= uid < 2**32 - 1:
        raise SandboxError(f"bad TTTR_SANDBOX_UID {text!r}: give an unprivileged uid such as 100000 (not 0)")
    return uid


SOURCE = c_source(Path(__file__).with_name("launcher.c"))


def build_launcher() -> tuple[Path | None, str | None]:
    """(path of the compiled launcher, None) or (None, why it could not be built)."""
    return build_shared("launch", SOURCE, ["-O2", f"-DSECCOMP_FD={SECCOMP_FD}"], "the sandbox launcher")


def launch_prefix(launcher: str, seccomp: str | None, host_uid: int | None,
                  binds: dict[str, str] | None = None) -> list[str]:
    """argv that runs the launcher before bwrap. With `host_uid` (TTTR runs as root), each
    `binds` {name: host directory} appears at STAGE/name for bwrap."""
    argv = [launcher]
    if host_uid is not None:
        argv += ["-u", str(host_uid), "-g", str(host_uid), "-s", STAGE]
        for name, src in (binds or {}).items():
            argv += ["-b", src, name]
    if seccomp:
        argv += ["-f", seccomp]
    return argv + ["--"]
