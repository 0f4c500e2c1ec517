"""The file system a sandboxed command sees: the host's programs read-only, a small
synthetic /etc, private /dev, /proc and /tmp, the task tree read-write at /work, and
a runtime directory (/run/tttr) holding the randomness shim and the bash start file.

Everything else is read-only: the root, /dev (but /dev/shm), and the kernel interfaces
under /proc, as Docker and Flatpak do: /proc/sys, /proc/bus, /proc/fs, /proc/irq are
bound read-only and files such as /proc/sysrq-trigger, /proc/keys, /proc/timer_list are
covered with /dev/null. /tmp and /dev/shm are tmpfs mounts of a fixed size."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from tttr.sessions.cache import cache_dir
from tttr.recorders.seedrandom import STEP_DIR

SANDBOX_ROOT = "/work"          # where the task tree appears inside the sandbox
RUNTIME = "/run/tttr"           # runtime files inside the sandbox
UID = 1000                      # the agent's uid/gid inside the sandbox (user namespace)

# Host directories with programs and libraries; a symlink is recreated, a directory bound.
PROGRAM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# /etc entries programs need to start and behave; nothing with secrets or host identity.
HOST_ETC = (
    "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates",
    "python3", "python3.11", "python3.12", "python3.13", "perl", "mime.types", "protocols",
    "services", "magic", "magic.mime", "inputrc", "os-release", "debian_version",
)
SYNTHETIC_ETC = {
    "passwd": (
        "root:x:0:0:root:/root:/bin/bash\n"
        f"agent:x:{UID}:{UID}:agent:{SANDBOX_ROOT}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": f"root:x:0:\nagent:x:{UID}:\nnogroup:x:65534:\n",
    "hostname": "sandbox\n",
    "hosts": "127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\n",
}
# Sourced by every non-interactive bash (BASH_ENV): seeds $RANDOM from the step seed and
# the shell's pid, so nested bash scripts draw the same numbers on replay.
BASHENV = '[ -n "$TTTR_SEED" ] && RANDOM=$(( 16#${TTTR_SEED:0:8} ^ $$ ))\n'


def runtime_dir(shim: Path | None, preload: tuple[str, ...] = ()) -> Path:
    """A directory in the cache with the synthetic /etc files, bashenv, the shim and the
    sandbox's /etc/ld.so.preload (`preload`: paths inside the sandbox)."""
    key = hashlib.sha256(repr((SYNTHETIC_ETC, BASHENV, str(shim), "empty", preload)).encode()).hexdigest()[:16]
    path = cache_dir() / f"runtime-{key}"
    if (path / "ready").exists():
        return path
    tmp = cache_dir() / f".runtime-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "etc").mkdir(parents=True)
    for name, text in SYNTHETIC_ETC.items():
        (tmp / "etc" / name).write_text(text)
    (tmp / "bashenv").write_text(BASHENV)
    (tmp / "empty").mkdir()
    if preload:
        (tmp / "ld.so.preload").write_text("".join(f"{lib}\n" for lib in preload))
    if shim is not None:
        shutil.copy2(shim, tmp / "seedrandom.so")
    (tmp / "ready").write_text("")
    try:
        os.rename(tmp, path)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return path


# Kernel interfaces under /proc: read-only where they are directories of settings,
# covered where reading them leaks host state or writing them acts on the host. (/proc/bus,
# /proc/fs and /proc/irq, which Docker also binds read-only, belong to host root and the
# sandbox's uid has no capability: a mount each would buy nothing.)
PROC_READ_ONLY = ("sys",)
# (/proc/kmsg is root's alone and /proc/kallsyms shows zeros to others: not covered, a mount each.)
PROC_MASKED_FILES = ("sysrq-trigger", "kcore", "keys", "key-users", "timer_list", "timer_stats",
                     "sched_debug", "latency_stats")
PROC_MASKED_DIRS = ("acpi", "asound", "scsi")


def proc_args(proc_entries: frozenset[str] | None, runtime: str) -> list[str]:
    """bwrap arguments that make /proc's kernel interfaces read-only or empty. `proc_entries`
    are the names a sandbox's /proc holds (the probe lists them): bwrap cannot cover a
    name that is not there."""
    have = proc_entries if proc_entries is not None else frozenset(os.listdir("/proc"))
    args: list[str] = []
    for name in PROC_READ_ONLY:
        if name in have and os.path.exists(f"/proc/{name}"):
            args += ["--ro-bind", f"/proc/{name}", f"/proc/{name}"]
    for name in PROC_MASKED_FILES:
        if name in have:
            args += ["--ro-bind", "/dev/null", f"/proc/{name}"]
    for name in PROC_MASKED_DIRS:
        if name in have:
            args += ["--ro-bind", f"{runtime}/empty", f"/proc/{name}"]
    return args


def bwrap_fs_args(tree: str, runtime: str, tmp_bytes: int, proc_entries: frozenset[str] | None,
                  preload: bool = False) -> list[str]:
    """The mounts of a sandbox. `tree` and `runtime` are the paths bwrap opens (the
    launcher's stage when TTTR runs as root); `tmp_bytes` sizes /tmp and /dev/shm;
    `preload`: the runtime dir holds an ld.so.preload for /etc."""
    args: list[str] = []
    for d in PROGRAM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for name in HOST_ETC:
        src = f"/etc/{name}"
        if os.path.lexists(src) and os.path.exists(src):
            args += ["--ro-bind", src, src]
    # symlinks into the read-only runtime dir rather than a mount each: bwrap pays for every mount
    for name in SYNTHETIC_ETC:
        args += ["--symlink", f"{RUNTIME}/etc/{name}", f"/etc/{name}"]
    if preload:
        args += ["--symlink", f"{RUNTIME}/ld.so.preload", "/etc/ld.so.preload"]
    args += ["--ro-bind", runtime, RUNTIME, "--proc", "/proc", *proc_args(proc_entries, runtime)]
    args += [
        "--dev", "/dev",
        "--size", str(tmp_bytes), "--tmpfs", "/dev/shm",
        "--size", str(tmp_bytes), "--tmpfs", "/tmp",
        "--symlink", "../tmp", "/var/tmp",
        "--bind", tree, SANDBOX_ROOT,
    ]
    return args


def step_args(step: str) -> list[str]:
    """One command's files (`step`, as bwrap opens it): the pinned clock and seed
    variables at STEP_DIR, the clock as /etc/faketimerc, and the seeded FIFO as
    /dev/urandom and /dev/random."""
    return ["--ro-bind", step, STEP_DIR, "--symlink", f"{STEP_DIR}/faketimerc", "/etc/faketimerc",
            "--ro-bind", f"{step}/urandom", "/dev/urandom", "--ro-bind", f"{step}/urandom", "/dev/random"]


# After every other mount (the per-command ones included): nothing but the tree, /tmp and
# /dev/shm stays writable.
READ_ONLY_TAIL = ["--remount-ro", "/dev", "--remount-ro", "/"]
