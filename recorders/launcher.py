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

Built with the system C compiler on first use, like the randomness shim.
"""

from __future__ import annotations

import os
from pathlib import Path

from tttr.sessions.cache import build_shared
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


SOURCE = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

/* tttr-launch [-u UID -g GID -s STAGE [-b SRC NAME]...] [-f SECCOMP_FILE] -- PROGRAM ARGS... */

static void die(const char *what, const char *arg) {
    fprintf(stderr, "tttr-launch: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
    exit(125);
}

static void usage(void) {
    fputs("usage: tttr-launch [-u UID -g GID -s STAGE [-b SRC NAME]...] [-f SECCOMP] -- PROGRAM ARGS...\n", stderr);
    exit(125);
}

int main(int argc, char **argv) {
    long uid = -1, gid = -1;
    const char *stage = NULL, *seccomp = NULL, *src[16], *name[16];
    int nb = 0, fds[16], i;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--")) { i++; break; }
        if (i + 1 >= argc) usage();
        if (!strcmp(argv[i], "-u")) uid = atol(argv[++i]);
        else if (!strcmp(argv[i], "-g")) gid = atol(argv[++i]);
        else if (!strcmp(argv[i], "-s")) stage = argv[++i];
        else if (!strcmp(argv[i], "-f")) seccomp = argv[++i];
        else if (!strcmp(argv[i], "-b") && i + 2 < argc && nb < 16) {
            src[nb] = argv[i + 1]; name[nb] = argv[i + 2]; nb++; i += 2;
        } else usage();
    }
    if (i >= argc) usage();
    if (seccomp) {
        int fd = open(seccomp, O_RDONLY | O_CLOEXEC);
        if (fd < 0) die("open", seccomp);
        if (fd == SECCOMP_FD) { if (fcntl(fd, F_SETFD, 0) < 0) die("fcntl", seccomp); }
        else { if (dup2(fd, SECCOMP_FD) < 0) die("dup2", seccomp); close(fd); }
    }
    if (uid >= 0) {
        if (uid == 0 || gid <= 0 || !stage) usage();
        if (unshare(CLONE_NEWNS) < 0) die("unshare", "mount namespace");
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) die("mount", "--make-rprivate /");
        /* opened in the new namespace (a bind source must be one of its mounts), before the
           stage's tmpfs can hide them */
        for (int b = 0; b < nb; b++) {
            fds[b] = open(src[b], O_PATH | O_DIRECTORY | O_CLOEXEC);
            if (fds[b] < 0) die("open", src[b]);
        }
        if (mount("tttr-stage", stage, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k") < 0)
            die("mount tmpfs on", stage);
        for (int b = 0; b < nb; b++) {
            char dest[PATH_MAX], proc[64];
            snprintf(dest, sizeof dest, "%s/%s", stage, name[b]);
            snprintf(proc, sizeof proc, "/proc/self/fd/%d", fds[b]);
            if (mkdir(dest, 0755) < 0) die("mkdir", dest);
            if (mount(proc, dest, NULL, MS_BIND, NULL) < 0) die("bind", src[b]);
            close(fds[b]);
        }
        if (setgroups(0, NULL) < 0) die("setgroups", "");
        if (setresgid(gid, gid, gid) < 0) die("setresgid", "");
        if (setresuid(uid, uid, uid) < 0) die("setresuid", "");
        if (getuid() != uid || geteuid() != uid || getgid() != gid) { errno = EPERM; die("drop privileges", ""); }
    }
    execv(argv[i], argv + i);
    die("exec", argv[i]);
    return 125;
}
""".replace("SECCOMP_FD", str(SECCOMP_FD))


def build_launcher() -> tuple[Path | None, str | None]:
    """(path of the compiled launcher, None) or (None, why it could not be built)."""
    return build_shared("launch", SOURCE, ["-O2"], "the sandbox launcher")


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
