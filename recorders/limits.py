"""Resource limits of one sandboxed command, and the executor's cgroup that enforces the
process limit where the rlimit cannot (root is exempt from RLIMIT_NPROC) and bounds the
memory of all its processes together (RLIMIT_AS is per process)."""

from __future__ import annotations

import math
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tttr.recorders.errors import SandboxError
from tttr.recorders.scratch import pid_alive


MAX_TIMEOUT_S = 3600.0


@dataclass(frozen=True, slots=True)
class Limits:
    timeout_s: float = 30.0          # wall clock per command
    max_processes: int = 256         # pids cgroup (or RLIMIT_NPROC for non-root)
    memory_mb: int = 2048            # RLIMIT_AS per process
    memory_total_mb: int = 4096      # all of a command's processes together (memory cgroup)
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
            "memory_total_mb": self.memory_total_mb >= 64,
            "file_size_mb": self.file_size_mb >= 1,
            "output_cap": self.output_cap >= 256,
            "tree_mb": self.tree_mb >= 1,
            "tmp_mb": self.tmp_mb >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise SandboxError(
                    f"bad limit {name}={getattr(self, name)!r}: timeout_s > 0, max_processes >= 8, "
                    "memory_mb >= 64, memory_total_mb >= 64, file_size_mb >= 1, output_cap >= 256, "
                    "tree_mb >= 1, tmp_mb >= 1"
                )

    def ulimit_line(self) -> str:
        """bash builtin call that sets soft and hard limits inside the sandbox."""
        return (
            f"ulimit -u {self.max_processes} -v {self.memory_mb * 1024} "
            f"-f {min(self.file_size_mb, self.tree_mb) * 1024} -c 0 2>/dev/null"
        )


def find_cgroup_root(controller: str) -> Path | None:
    """The directory under which this process may create a cgroup with `controller`
    ("pids", "memory"), or None: its own cgroup in that controller's v1 hierarchy, or its
    v2 cgroup where the controller is delegated to children."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
        own = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    v1 = {}
    for line in own:
        if line.count(":") >= 2:
            _, names, path = line.split(":", 2)
            v1 |= {name: path for name in names.split(",")}
    for line in mounts:
        parts = line.split()
        if len(parts) < 4:
            continue
        mnt, fstype, opts = parts[1], parts[2], parts[3].split(",")
        if fstype == "cgroup" and controller in opts:
            base = Path(mnt) / v1.get(controller, "/").lstrip("/")
            if os.access(base, os.W_OK):
                return base
        if fstype == "cgroup2":
            base = Path(mnt) / v1.get("", "/").lstrip("/")
            try:
                delegated = controller in (base / "cgroup.subtree_control").read_text().split()
            except OSError:
                delegated = False
            if delegated and os.access(base, os.W_OK):
                return base
    return None


# tttr-<recorder pid>-<n>-<its PID namespace>: a pid means nothing in another namespace
# (another container's recorder may share the hierarchy), so only our namespace's are swept.
CGROUP_NAME = re.compile(r"tttr-(\d+)-\d+(?:-(\d+))?")


def _pid_namespace() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def remove_stale_cgroups(root: Path) -> list[str]:
    """Remove the cgroups `tttr-<pid>-<n>-<pidns>` under `root` whose recorder is dead: a
    recorder killed with SIGKILL never ran its cleanup, and what its commands started may
    still run there, so that is killed first. Returns the names removed. A pid that is
    alive again (reused) keeps its cgroup."""
    removed = []
    try:
        names = [e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return removed
    for name in names:
        m = CGROUP_NAME.fullmatch(name)
        if not m or m.group(2) not in (None, _pid_namespace()) or pid_alive(int(m.group(1))):
            continue
        if _kill_and_remove(root / name):
            removed.append(name)
    return removed


def _kill_and_remove(path: Path, spare: int | None = None) -> bool:
    """SIGKILL every process in the cgroup at `path` but `spare`, and remove it once they
    are gone (within about a second). False when it is still there."""
    for _ in range(100):
        _kill_procs(path, spare)
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.01)
    return False


def _kill_procs(path: Path, spare: int | None) -> None:
    if spare is None and (path / "cgroup.kill").exists():  # cgroup v2, Linux 5.14: no pid to race
        try:
            (path / "cgroup.kill").write_text("1")
            return
        except OSError:
            pass
    try:
        pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return
    for pid in pids:
        if pid != spare:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


class ExecutorCgroup:
    """One cgroup per executor, which every command of the executor is started inside: the
    process limit (pids.max) and, where the memory controller is delegated too, the memory
    all its processes may hold together (memory.max on v2, memory.limit_in_bytes on v1;
    swap included). On cgroup v1 the two are directories of the same name in two
    hierarchies. Creating one first kills and removes those that recorders killed with
    SIGKILL left behind."""

    def __init__(self, pids_root: Path, max_processes: int, memory_root: Path | None = None,
                 memory_bytes: int = 0):
        name = f"tttr-{os.getpid()}-{time.monotonic_ns()}-{_pid_namespace()}"
        self.path = pids_root / name
        self.memory = memory_root / name if memory_root is not None else None
        self.dirs = [self.path] + ([self.memory] if self.memory not in (None, self.path) else [])
        for d in self.dirs:
            remove_stale_cgroups(d.parent)
        try:
            for d in self.dirs:
                d.mkdir()
            (self.path / "pids.max").write_text(str(max_processes))
            if self.memory is not None:
                self._limit_memory(memory_bytes)
        except OSError as exc:
            self.close()
            raise SandboxError(f"cannot create the executor's cgroup {name} under {pids_root}"
                               f"{f' and {memory_root}' if self.memory else ''}: {exc}") from None

    def _limit_memory(self, limit: int) -> None:
        m = self.memory
        if (m / "memory.max").exists():  # v2
            (m / "memory.max").write_text(str(limit))
            for knob, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (m / knob).exists():
                    (m / knob).write_text(value)
        else:
            (m / "memory.limit_in_bytes").write_text(str(limit))
            if (m / "memory.memsw.limit_in_bytes").exists():  # no going past it into swap
                (m / "memory.memsw.limit_in_bytes").write_text(str(limit))

    @property
    def procs(self) -> list[str]:
        """The cgroup.procs files a process writes its pid to, to join (one per hierarchy)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def oom_kills(self) -> int:
        """How many processes the kernel has killed for the memory limit so far."""
        if self.memory is None:
            return 0
        for name in ("memory.events", "memory.oom_control"):  # v2, v1
            try:
                text = (self.memory / name).read_text()
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def kill_all(self, spare: int | None = None) -> None:
        _kill_procs(self.path, spare)

    def close(self) -> None:
        for d in self.dirs:
            _kill_and_remove(d)
