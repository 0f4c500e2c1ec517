"""What this machine allows the sandbox to use, detected once per process.

Each mechanism is tried with a real bubblewrap start; what the machine refuses is said in
one line (`SandboxSupport.line()`). As root, a sandbox that cannot run as an unprivileged
uid in a user namespace is refused outright: its processes would be host root."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tttr.recorders.launcher import SECCOMP_FD, build_launcher, launch_prefix, sandbox_host_uid
from tttr.recorders.limits import find_cgroup_root
from tttr.recorders.seccomp import seccomp_program
from tttr.recorders.seedrandom import build_shim

NAMESPACE_FLAGS = ["--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-ipc"]
FAKETIME_GLOBS = (
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
    "/usr/lib64/faketime/libfaketime.so.1",
)


@dataclass(frozen=True, slots=True)
class SandboxSupport:
    bwrap: str | None            # path of bubblewrap, when it runs with new namespaces
    namespaces: bool             # new PID, network, UTS and IPC namespaces work
    userns: bool                 # a user namespace too (the agent is uid 1000 inside)
    faketime: str | None         # libfaketime path, for the virtual clock
    shim: str | None             # compiled randomness shim
    pids_cgroup: str | None      # where per-executor pids cgroups are created
    nproc_rlimit: bool           # RLIMIT_NPROC binds (not root)
    reason: str | None           # why the sandbox is refused, one line; None when it works
    notes: tuple[str, ...] = ()  # mechanisms missing without refusing (clock, randomness, pids)
    launcher: str | None = None  # compiled launcher (drops root, passes the seccomp program)
    host_uid: int | None = None  # unprivileged host uid the sandbox runs as when TTTR is root
    no_userns: bool = False      # bwrap --disable-userns: no user namespaces inside
    seccomp: str | None = None   # BPF program file for bwrap --seccomp
    proc_entries: frozenset[str] | None = None  # names in a sandbox's /proc
    memory_cgroup: str | None = None  # where per-executor memory cgroups are created (beside pids)

    @property
    def ok(self) -> bool:
        return self.reason is None

    def mechanisms(self) -> list[str]:
        out = []
        if self.ok:
            out += ["bwrap", "pid-ns", "net-ns", "uts-ns", "ipc-ns"]
            if self.userns:
                out.append("user-ns")
            if self.host_uid is not None or os.geteuid() != 0:
                out.append("unprivileged-uid")
            out += ["cap-drop", "ro-root", "ro-proc-sys", "masked-proc"]
            if self.no_userns:
                out.append("no-userns")
            if self.seccomp:
                out.append("seccomp")
        if self.faketime:
            out.append("faketime")
        if self.shim:
            out.append("seeded-getrandom")
        if self.ok:
            out.append("seeded-urandom")          # /dev/urandom and /dev/random: a seeded FIFO
            if self.faketime or self.shim:
                out.append("preload-all")         # /etc/ld.so.preload: whatever LD_PRELOAD says
            if self.faketime and self.shim:
                out.append("pinned-clock-vars")   # FAKETIME & co. answered from a read-only file
        out += ["seeded-$RANDOM", "pinned-env", "timeout", "rlimit-as", "rlimit-fsize", "output-cap"]
        if self.ok:
            out += ["tree-quota", "tmp-size"]
        if self.pids_cgroup:
            out.append("pids-cgroup")
        if self.memory_cgroup:
            out.append("memory-cgroup")
        if self.nproc_rlimit:
            out.append("rlimit-nproc")
        return out

    def line(self) -> str:
        if not self.ok:
            return f"sandbox: refused ({self.reason})"
        extra = f"; missing: {'; '.join(self.notes)}" if self.notes else ""
        return "sandbox: " + ", ".join(self.mechanisms()) + extra

    def to_json(self) -> dict:
        return {
            "ok": self.ok, "reason": self.reason, "mechanisms": self.mechanisms(),
            "notes": list(self.notes), "bwrap": self.bwrap, "faketime": self.faketime,
            "shim": self.shim, "pids_cgroup": self.pids_cgroup, "memory_cgroup": self.memory_cgroup,
            "launcher": self.launcher,
            "host_uid": self.host_uid, "seccomp": self.seccomp,
        }


def find_faketime() -> str | None:
    override = os.environ.get("TTTR_FAKETIME_LIB")
    if override:
        return override if os.path.exists(override) else None
    for pattern in FAKETIME_GLOBS:
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    return None


def _try_bwrap(prefix: list[str], bwrap: str, extra: list[str]) -> tuple[str | None, str]:
    """(None, stdout) when bwrap starts a sandbox with `extra` and lists its /proc there,
    else (the last line bwrap said, "")."""
    args = [*prefix, bwrap, *extra, *NAMESPACE_FLAGS, "--die-with-parent"]
    for d in ("/usr", "/bin", "/lib", "/lib64"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    args += ["--proc", "/proc", "--dev", "/dev", "ls", "-1", "/proc"]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc), ""
    if proc.returncode == 0:
        return None, proc.stdout
    return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1], ""


@functools.lru_cache(maxsize=1)
def probe() -> SandboxSupport:
    notes: list[str] = []
    faketime = find_faketime()
    if not faketime:
        notes.append("libfaketime not found (install the faketime package): the clock is real")
    shim_path, why = build_shim()
    if why:
        notes.append(why + ": getrandom is not seeded")
    pids_root = find_cgroup_root("pids")
    memory_root = find_cgroup_root("memory") if pids_root else None  # joined by the same spawner
    nproc = os.geteuid() != 0
    if not pids_root and not nproc:
        notes.append("running as root without a writable pids cgroup: no process limit, only the timeout")
    if not memory_root:
        notes.append("no writable memory cgroup (the memory controller is not delegated here): a command's "
                     "memory is bounded per process only (RLIMIT_AS)")
    seccomp, why = seccomp_program()
    root = os.geteuid() == 0
    launcher, why_launcher = build_launcher()
    host_uid = sandbox_host_uid() if root else None

    bwrap = shutil.which("bwrap")
    reason = None
    userns = no_userns = False
    listing = ""
    if bwrap is None:
        reason = "bubblewrap (bwrap) is not installed; install the bubblewrap package"
    elif root and launcher is None:
        reason = f"as root the sandbox must drop to an unprivileged uid, which needs its launcher: {why_launcher}"
    else:
        if launcher is None:
            notes.append(f"{why_launcher}: no seccomp filter")
            seccomp = None
        elif why:
            notes.append(why)

        def attempt(user: bool, nested_off: bool, filtered: bool) -> tuple[str | None, str]:
            extra = ["--unshare-user", "--uid", "1000", "--gid", "1000"] if user else []
            extra += ["--cap-drop", "ALL"]
            if nested_off:
                extra.append("--disable-userns")
            if filtered:
                extra += ["--seccomp", str(SECCOMP_FD)]
            prefix = launch_prefix(str(launcher), seccomp if filtered else None, host_uid) if launcher else []
            return _try_bwrap(prefix, bwrap, extra)

        err, listing = attempt(True, True, bool(seccomp))
        if err is None:
            userns = no_userns = True
        else:
            err_user, listing = attempt(True, False, False)
            if err_user is None:
                userns = True
                err_nested, _ = attempt(True, True, False)
                no_userns = err_nested is None
                if not no_userns:
                    notes.append(f"bwrap --disable-userns refused ({err_nested}): nested user namespaces "
                                 "are only stopped by seccomp")
                if seccomp:
                    err_filter, _ = attempt(True, no_userns, True)
                    if err_filter is not None:
                        notes.append(f"bwrap refused the seccomp program ({err_filter}): no seccomp filter")
                        seccomp = None
                    else:
                        err, listing = attempt(True, no_userns, True)
            elif root:
                reason = (f"as root the sandbox must run as unprivileged uid {host_uid} in a user namespace, "
                          f"and this machine refuses it: {err_user}")
            else:
                err_plain, listing = attempt(False, False, False)
                if err_plain is not None:
                    reason = f"bubblewrap cannot create namespaces here: {err_plain}"
                else:
                    notes.append(f"user namespaces refused ({err_user}): no nested-namespace lock")
                    if seccomp and attempt(False, False, True)[0] is not None:
                        notes.append("bwrap refused the seccomp program: no seccomp filter")
                        seccomp = None
    entries = frozenset(listing.split()) if listing else None
    return SandboxSupport(
        bwrap=bwrap if reason is None else None,
        namespaces=reason is None,
        userns=userns,
        faketime=faketime,
        shim=str(shim_path) if shim_path else None,
        pids_cgroup=str(pids_root) if pids_root else None,
        memory_cgroup=str(memory_root) if memory_root else None,
        nproc_rlimit=nproc,
        reason=reason,
        notes=tuple(notes),
        launcher=str(launcher) if launcher and reason is None else None,
        host_uid=host_uid if reason is None else None,
        no_userns=no_userns,
        seccomp=seccomp if reason is None else None,
        proc_entries=entries,
    )


def shim_path(support: SandboxSupport) -> Path | None:
    return Path(support.shim) if support.shim else None
