"""Resource limits of one sandboxed command, and the pids cgroup that enforces the
process limit where the rlimit cannot (root is exempt from RLIMIT_NPROC)."""

from __future__ import annotations

import math
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tttr.recorders.errors import SandboxError


MAX_TIMEOUT_S = 3600.0


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_s: float = 30.0          # wall clock per command
    max_processes: int = 256         # pids cgroup (or RLIMIT_NPROC for non-root)
    memory_mb: int = 2048            # RLIMIT_AS per process
    file_size_mb: int = 1024         # RLIMIT_FSIZE: largest file a command may write
    output_cap: int = 64 * 1024      # bytes of stdout and of stderr kept; the rest is counted
    tree_mb: int = 1024              # the task tree's size quota (the command is killed past it)
    tmp_mb: int = 256                # size of the sandbox's /tmp and of its /dev/shm (each a tmpfs)

    def __post_init__(self) -> None:
        t = self.timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or not 0 < t <= MAX_TIMEOUT_S:
            raise SandboxError(f"bad limit timeout_s={t!r}: give a number of seconds > 0 and <= {MAX_TIMEOUT_S:g}")
        checks = {
            "max_processes": self.max_processes >= 8,
            "memory_mb": self.memory_mb >= 64,
            "file_size_mb": self.file_size_mb >= 1,
            "output_cap": self.output_cap >= 256,
            "tree_mb": self.tree_mb >= 1,
            "tmp_mb": self.tmp_mb >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise SandboxError(
                    f"bad limit {name}={getattr(self, name)!r}: timeout_s > 0, max_processes >= 8, "
                    "memory_mb >= 64, file_size_mb >= 1, output_cap >= 256, tree_mb >= 1, tmp_mb >= 1"
                )

    def ulimit_line(self) -> str:
        """bash builtin call that sets soft and hard limits inside the sandbox."""
        return (
            f"ulimit -u {self.max_processes} -v {self.memory_mb * 1024} "
            f"-f {min(self.file_size_mb, self.tree_mb) * 1024} -c 0 2>/dev/null"
        )


def find_pids_root() -> Path | None:
    """The directory under which this process may create a pids cgroup, or None."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = {line.split(":", 2)[1]: line.split(":", 2)[2] for line in own if line.count(":") >= 2}
    for line in mounts:
        parts = line.split()
        if len(parts) < 4:
            continue
        mnt, fstype, opts = parts[1], parts[2], parts[3].split(",")
        if fstype == "cgroup" and "pids" in opts:
            base = Path(mnt) / v1.get("pids", "/").lstrip("/")
            if os.access(base, os.W_OK):
                return base
        if fstype == "cgroup2":
            base = Path(mnt) / v1.get("", "/").lstrip("/")
            try:
                delegated = "pids" in (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                delegated = False
            if delegated and os.access(base, os.W_OK):
                return base
    return None


CGROUP_NAME = re.compile(r"tttr-(\d+)-\d+")


def remove_stale_cgroups(root: Path) -> list[str]:
    """Remove the cgroups `tttr-<pid>-<ns>` under `root` whose recorder (pid) is dead: a
    recorder killed with SIGKILL never ran its cleanup. Returns the names removed. A pid
    that is alive again (reused) keeps its cgroup; one still holding processes too."""
    removed = []
    try:
        names = [e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return removed
    for name in names:
        m = CGROUP_NAME.fullmatch(name)
        if not m or _alive(int(m.group(1))):
            continue
        try:
            (root / name).rmdir()
            removed.append(name)
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class PidsCgroup:
    """One cgroup per executor; every command of the executor is started inside it.
    Creating one first removes those that recorders killed with SIGKILL left behind."""

    def __init__(self, root: Path, max_processes: int):
        remove_stale_cgroups(root)
        self.path = root / f"tttr-{os.getpid()}-{time.monotonic_ns()}"
        try:
            self.path.mkdir()
            (self.path / "pids.max").write_text(str(max_processes))
        except OSError as exc:
            raise SandboxError(f"cannot create pids cgroup {self.path}: {exc}") from None

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def kill_all(self, spare: int | None = None) -> None:
        try:
            pids = [int(p) for p in self.procs.read_text().split()]
        except OSError:
            return
        for pid in pids:
            if pid == spare:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self) -> None:
        for _ in range(50):
            self.kill_all()
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)
