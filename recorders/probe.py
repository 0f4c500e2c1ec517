"""What this machine allows the sandbox to use, detected once per process."""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from recorders.limits import find_pids_root
from recorders.seedrandom import build_shim

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

    @property
    def ok(self) -> bool:
        return self.reason is None

    def mechanisms(self) -> list[str]:
        out = []
        if self.ok:
            out += ["bwrap", "pid-ns", "net-ns", "uts-ns", "ipc-ns"]
            if self.userns:
                out.append("user-ns")
        if self.faketime:
            out.append("faketime")
        if self.shim:
            out.append("seeded-getrandom")
        out += ["seeded-$RANDOM", "pinned-env", "timeout", "rlimit-as", "rlimit-fsize", "output-cap"]
        if self.pids_cgroup:
            out.append("pids-cgroup")
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
            "shim": self.shim, "pids_cgroup": self.pids_cgroup,
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


def _try_bwrap(bwrap: str, extra: list[str]) -> str | None:
    args = [bwrap, *extra, *NAMESPACE_FLAGS, "--die-with-parent"]
    for d in ("/usr", "/bin", "/lib", "/lib64"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    args += ["--proc", "/proc", "--dev", "/dev", "true"]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if proc.returncode == 0:
        return None
    return (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]


@functools.lru_cache(maxsize=1)
def probe() -> SandboxSupport:
    notes: list[str] = []
    faketime = find_faketime()
    if not faketime:
        notes.append("libfaketime not found (install the faketime package): the clock is real")
    shim_path, why = build_shim()
    if why:
        notes.append(why + ": getrandom is not seeded")
    pids_root = find_pids_root()
    nproc = os.geteuid() != 0
    if not pids_root and not nproc:
        notes.append("running as root without a writable pids cgroup: no process limit, only the timeout")

    bwrap = shutil.which("bwrap")
    reason = None
    userns = False
    if bwrap is None:
        reason = "bubblewrap (bwrap) is not installed; install the bubblewrap package"
    else:
        err_userns = _try_bwrap(bwrap, ["--unshare-user", "--uid", "1000", "--gid", "1000"])
        if err_userns is None:
            userns = True
        else:
            err = _try_bwrap(bwrap, [])
            if err is not None:
                reason = f"bubblewrap cannot create namespaces here: {err}"
    return SandboxSupport(
        bwrap=bwrap if reason is None else None,
        namespaces=reason is None,
        userns=userns,
        faketime=faketime,
        shim=str(shim_path) if shim_path else None,
        pids_cgroup=str(pids_root) if pids_root else None,
        nproc_rlimit=nproc,
        reason=reason,
        notes=tuple(notes),
    )


def shim_path(support: SandboxSupport) -> Path | None:
    return Path(support.shim) if support.shim else None
