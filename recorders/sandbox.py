"""The executor: runs one agent command in a sandbox and returns what it saw and did.

Nothing else in the product executes agent commands. Each command runs in a fresh
bubblewrap sandbox (new PID, network, UTS, IPC and, where allowed, user namespaces) with
the task tree at /work, a pinned environment, a virtual clock (libfaketime) set to the
step's value, randomness seeded from (run seed, step), and resource limits. Shell state
(cwd, exports) is carried explicitly from one command to the next. With `logical_clock`,
the clock a command reads starts at the step's value and moves only with its reads and
sleeps, never with real time (recorders/logicalclock.py).

Whoever runs TTTR, the command cannot change the host outside its tree: it runs as an
unprivileged host uid (as root, the launcher drops to SANDBOX_HOST_UID and the tree is
handed to that uid before each command), with no capabilities, no nested user
namespaces, a read-only root and /proc/sys, and a seccomp filter (recorders/seccomp.py).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
import weakref
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from tttr.recorders.clock import clock_epoch, faketime_spec, iso, normalize_clock
from tttr.recorders.errors import SandboxError
from tttr.recorders.filetimes import SLACK_NS, clamp_times
from tttr.recorders.launcher import SECCOMP_FD, STAGE, launch_prefix
from tttr.recorders.limits import ExecutorCgroup, Limits
from tttr.recorders.logicalclock import VARIABLE as LOGICAL_CLOCK, logical_clock_value
from tttr.recorders.output import CappedBuffer, pump
from tttr.recorders.probe import NAMESPACE_FLAGS, SandboxSupport, probe, shim_path
from tttr.recorders.rootfs import READ_ONLY_TAIL, RUNTIME, SANDBOX_ROOT, UID, bwrap_fs_args, runtime_dir, step_args
from tttr.recorders.seedrandom import step_seed
from tttr.recorders.shell import TMP_FULL_MARK, ShellState, parse_state, prelude
from tttr.recorders.spawner import STATE_FD, Spawner, kill_group
from tttr.recorders.stepfiles import StepFiles
from tttr.recorders.treeown import _walk, hand_over, tree_bytes

__all__ = ["Executor", "CommandResult", "ShellState", "SandboxError", "SandboxSupport", "Limits", "probe"]

# What CommandResult.limit_hit can name: the wall-clock timeout (exit 124), the tree's size
# quota (the command is killed), a full /tmp or /dev/shm (seen while it ran, or by the exit
# trap), a file at the largest size a command may write (RLIMIT_FSIZE: EFBIG on stderr, a
# command killed by SIGXFSZ, or a file left at that size), the memory of all the command's
# processes together (the kernel killed one for the cgroup's limit; the command is killed).
LIMITS_HIT = ("timeout", "tree-quota", "tmp-full", "file-size", "memory")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STATE_CAP = 1 << 20
REFUSAL = (
    "refusing to run agent commands without a sandbox; pass --unsafe-no-sandbox "
    "(unsafe_no_sandbox=True) to run them directly on this machine, unconfined"
)


@dataclass(frozen=True, slots=True)
class CommandResult:
    command: str
    stdout: str                  # capped; a marker line ends it when truncated
    stderr: str
    exit_code: int               # 124 when the timeout killed it
    duration_ms: float
    stdout_size: int             # full sizes, whatever the cap kept
    stderr_size: int
    truncated: bool
    timed_out: bool
    clock: str                   # ISO, naive UTC: the virtual clock at the command's start
    step: int
    cwd: str                     # where it started (inside the sandbox)
    env: dict[str, str]          # the environment it saw
    state_after: ShellState
    mechanisms: tuple[str, ...]  # what confined and pinned it
    limit_hit: str | None = None  # LIMITS_HIT: which limit stopped or constrained the command

    def to_json(self) -> dict:
        return {
            "cmd": self.command, "cwd": self.cwd, "env": dict(self.env), "stdout": self.stdout,
            "stderr": self.stderr, "exit_code": self.exit_code, "duration_ms": round(self.duration_ms, 3),
            "stdout_size": self.stdout_size, "stderr_size": self.stderr_size, "truncated": self.truncated,
            "timed_out": self.timed_out, "clock": self.clock, "step": self.step,
            "state_after": self.state_after.to_json(), "mechanisms": list(self.mechanisms),
            "limit_hit": self.limit_hit,
        }


@dataclass(slots=True)
class _Prepared:
    argv: list[str]
    popen_env: dict[str, str]     # bwrap's environment (LD_PRELOAD is set inside only)
    env_seen: dict[str, str]      # what the command sees
    base_env: dict[str, str]      # pinned values, before the carried exports
    cwd: str | None


class Executor:
    """Runs agent commands against one tree. `seed` is the run's seed: the randomness a
    command sees depends only on (seed, step). `logical_clock`: every clock read returns a
    value that depends only on the command's reads and sleeps, not on elapsed real time
    (for recorded programs, whose replays run under other loads); without it, libfaketime's
    clock starts at the step's value and runs in real time."""

    def __init__(self, tree: Path | str, seed: int = 0, unsafe_no_sandbox: bool = False,
                 limits: Limits = Limits(), clamp_file_times: bool = True,
                 binds: tuple[tuple[str, ...], ...] = (), logical_clock: bool = False):
        self.tree = Path(tree).resolve()
        # (host directory, path inside) bound read-only: the host's Python, the model's socket;
        # (host directory, path inside, "rw") read-write: a recorded program's shared clock file
        self.binds = tuple((str(b[0]), str(b[1]), *b[2:]) for b in binds)
        if not self.tree.is_dir():
            raise SandboxError(f"tree {str(tree)!r} is not a directory: create it or pass an existing one")
        if not isinstance(seed, int) or seed < 0:
            raise SandboxError(f"bad seed {seed!r}: give a non-negative integer")
        self.seed = seed
        self.limits = limits
        self.support = probe()
        if not self.support.ok and not unsafe_no_sandbox:
            raise SandboxError(f"{self.support.line()}; {REFUSAL}")
        self.sandboxed = self.support.ok
        self.clamp_file_times = clamp_file_times
        self._shim = shim_path(self.support)
        self.logical_clock = logical_clock and self._shim is not None  # the shim keeps it
        inside = tuple(self._preload_libs(inside=True)) if self.sandboxed else ()
        self._runtime = runtime_dir(self._shim, inside)
        self._cgroup: ExecutorCgroup | None = None
        self._spawn: Spawner | None = None
        self._finalizer = None
        self._fs_args: list[str] | None = None
        self._host_uid = self.support.host_uid if self.sandboxed else None

    # -- public ---------------------------------------------------------------------------

    @property
    def mechanisms(self) -> tuple[str, ...]:
        mech = list(self.support.mechanisms())
        if not self.sandboxed:
            mech.append("unsafe-no-sandbox")
        if self.clamp_file_times:
            mech.append("file-times-clamped")
        if self.logical_clock:
            mech.append("logical-clock")
        return tuple(mech)

    def base_env(self, clock: datetime, step: int) -> dict[str, str]:
        user = "agent" if (self.sandboxed and self.support.userns) else ("root" if os.geteuid() == 0 else "agent")
        env = {
            "PATH": PATH, "HOME": SANDBOX_ROOT, "USER": user, "LOGNAME": user, "HOSTNAME": "sandbox",
            "SHELL": "/bin/bash", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC", "TERM": "dumb",
            "PAGER": "cat", "TMPDIR": "/tmp", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "SOURCE_DATE_EPOCH": str(clock_epoch(clock)),
            "TTTR_SEED": f"{step_seed(self.seed, step):016x}",
            "BASH_ENV": f"{RUNTIME}/bashenv" if self.sandboxed else str(self._runtime / "bashenv"),
        }
        if self.support.faketime:
            env["FAKETIME"] = faketime_spec(clock)
            env["FAKETIME_DONT_FAKE_MONOTONIC"] = "1"
            env["DONT_FAKE_MONOTONIC"] = "1"  # the name before libfaketime 0.9.10
            env["FAKETIME_DISABLE_SHM"] = "1"  # no cross-process shared memory to leak state
        if self.logical_clock:
            env[LOGICAL_CLOCK] = logical_clock_value(clock)
        return env

    def run(self, command: str, clock: datetime, step: int = 0, state: ShellState | None = None) -> CommandResult:
        if not isinstance(command, str) or "\0" in command:
            raise SandboxError(f"bad command {command!r}: give a shell command line without NUL bytes")
        clock = normalize_clock(clock)
        state = state or ShellState()
        out, err, dump = (CappedBuffer(self.limits.output_cap), CappedBuffer(self.limits.output_cap),
                          CappedBuffer(STATE_CAP))
        if self._host_uid is not None:
            # root wrote or restored files since the last command: the sandbox's uid must own them
            hand_over(str(self.tree), self._host_uid, self._host_uid)
        files = StepFiles(self.base_env(clock, step), step_seed(self.seed, step)) if self.sandboxed else None
        try:
            spawner = self._spawner()
            pipes = [os.pipe() for _ in range(3)]  # stdout, stderr, state channel
            prep = self._prepare(command, clock, step, state, state_fd=STATE_FD if spawner else pipes[2][1],
                                 step_dir=files.path if files else None)
            reads = [r for r, _ in pipes]
            oom_before = self._cgroup.oom_kills() if spawner else 0
            started_ns = time.time_ns()
            t0 = time.perf_counter()
            try:
                proc = self._launch(prep, spawner, tuple(w for _, w in pipes))
            except BaseException:
                for r in reads:
                    os.close(r)
                raise
            finally:
                for _, w in pipes:
                    os.close(w)
            watch = _Watch(self, proc, started_ns, oom_before) if self.sandboxed else None
            try:
                hit = pump(
                    {reads[0]: out, reads[1]: err, reads[2]: dump},
                    deadline=time.monotonic() + self.limits.timeout_s,
                    exited=lambda: proc.poll() is not None, kill=proc.kill,
                    watch=watch, feed=files.feed if files else None,
                )
                code = proc.wait()
            finally:
                for r in reads:
                    os.close(r)
        finally:
            if files is not None:
                files.close()
        duration_ms = (time.perf_counter() - t0) * 1000
        if code < 0:
            code = 128 - code
        stderr = err.text()
        sizes = _Sizes(watch) if hit is None and watch is not None else None
        if self.clamp_file_times:  # one walk: each entry measured (its mtime not yet clamped), then clamped
            clamp_times(str(self.tree), started_ns, time.time_ns(), clock_epoch(clock),
                        seen=sizes.add if sizes is not None else None)
        if sizes is not None:
            hit = watch.after(stderr, code, tmp_full=TMP_FULL_MARK in bytes(dump.data),
                              sizes=sizes if self.clamp_file_times else None)
        if hit is not None:
            if hit == "timeout":
                code = 124
            elif hit in ("tree-quota", "memory"):
                code = code or 1
            stderr += f"[tttr: {self._limit_line(hit)}]\n"
        timed_out = hit == "timeout"
        root = SANDBOX_ROOT if self.sandboxed else str(self.tree)
        after = parse_state(bytes(dump.data), state, prep.base_env, root=root) if not timed_out else state
        return CommandResult(
            command=command, stdout=out.text(), stderr=stderr, exit_code=code, duration_ms=duration_ms,
            stdout_size=out.size, stderr_size=err.size, truncated=out.truncated or err.truncated,
            timed_out=timed_out, clock=iso(clock), step=step, cwd=state.cwd, env=prep.env_seen,
            state_after=after, mechanisms=self.mechanisms, limit_hit=hit,
        )

    def _limit_line(self, hit: str) -> str:
        lim = self.limits
        return {
            "timeout": f"command killed after the {lim.timeout_s:g} s timeout",
            "tree-quota": f"the tree went past its {lim.tree_mb} MB quota; command stopped",
            "tmp-full": f"/tmp or /dev/shm is full (each holds {lim.tmp_mb} MB)",
            "file-size": f"a file reached the {min(lim.file_size_mb, lim.tree_mb)} MB a command may write",
            "memory": f"the command's processes went past the {lim.memory_total_mb} MB they may hold together; "
                      "command stopped",
        }[hit]

    def close(self) -> None:
        """Stop the spawner and remove the cgroup; a later run() starts them again."""
        if self._finalizer is not None:
            self._finalizer()
        self._finalizer = self._spawn = self._cgroup = None

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------

    def _spawner(self) -> Spawner | None:
        """The spawner inside this executor's cgroup; None where there is no cgroup."""
        if not (self.sandboxed and self.support.pids_cgroup):
            return None
        if self._spawn is not None and self._spawn.alive():
            return self._spawn
        if self._cgroup is None:
            try:
                memory = self.support.memory_cgroup
                self._cgroup = ExecutorCgroup(Path(self.support.pids_cgroup), self.limits.max_processes,
                                              Path(memory) if memory else None, self.limits.memory_total_mb << 20)
            except SandboxError:
                self.support = replace(self.support, pids_cgroup=None, memory_cgroup=None)
                return None
        self._spawn = Spawner(self._cgroup.procs)
        if self._finalizer is not None:
            self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _cleanup, self._spawn, self._cgroup)
        return self._spawn

    def _launch(self, prep: _Prepared, spawner: Spawner | None, fds: tuple[int, int, int]) -> "_Running":
        if spawner is not None:
            with spawner.lock:
                pid = spawner.spawn(prep.argv, prep.popen_env, fds)
            return _Running(pid, spawner=spawner, cgroup=self._cgroup)
        try:
            popen = subprocess.Popen(
                prep.argv, env=prep.popen_env, cwd=prep.cwd, stdin=subprocess.DEVNULL,
                stdout=fds[0], stderr=fds[1], pass_fds=(fds[2],), start_new_session=True,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start the sandbox ({prep.argv[0]}): {exc}") from None
        return _Running(popen.pid, popen=popen)

    def _preload_libs(self, inside: bool) -> list[str]:
        """The shim first (its getenv() answers libfaketime's), then libfaketime."""
        libs = []
        if self._shim is not None:
            libs.append(f"{RUNTIME}/seedrandom.so" if inside else str(self._runtime / "seedrandom.so"))
        if self.support.faketime:
            libs.append(self.support.faketime)
        return libs

    def _preload(self, inside: bool) -> str:
        return ":".join(self._preload_libs(inside))

    def _prepare(self, command: str, clock: datetime, step: int, state: ShellState,
                 state_fd: int = STATE_FD, step_dir: str | None = None) -> _Prepared:
        base = self.base_env(clock, step)
        env = {**base, **state.exports}
        preload = self._preload(inside=self.sandboxed)
        seen = {**env, "LD_PRELOAD": preload} if preload else dict(env)
        root = SANDBOX_ROOT if self.sandboxed else str(self.tree)
        # Popen keeps an inherited descriptor's number; the spawner puts it at STATE_FD.
        script = prelude(state, self.limits.ulimit_line(), root=root, state_fd=state_fd, probe_tmp=self.sandboxed)
        shell = ["/bin/bash", "--noprofile", "--norc", "-c", script, "bash", command]
        if not self.sandboxed:
            return _Prepared(shell, seen, seen, base, str(self.tree))
        if self._fs_args is None:
            self._fs_args = self._bwrap_args()
        sup = self.support
        argv: list[str] = []
        step_src = step_dir
        if sup.launcher:
            binds = None
            if self._host_uid is not None:  # bwrap, unprivileged, opens them at the stage
                binds = {"w": str(self.tree), "r": str(self._runtime)}
                binds |= {f"x{i}": b[0] for i, b in enumerate(self.binds)}
                if step_dir:
                    binds["s"], step_src = step_dir, f"{STAGE}/s"
            argv += launch_prefix(sup.launcher, sup.seccomp, self._host_uid, binds)
        argv += self._fs_args
        if step_src:
            argv += step_args(step_src)
        argv += READ_ONLY_TAIL
        argv += ["--chdir", SANDBOX_ROOT]
        if preload:
            argv += ["--setenv", "LD_PRELOAD", preload]
        argv += shell
        return _Prepared(argv, env, seen, base, None)

    def _bwrap_args(self) -> list[str]:
        """The bwrap arguments common to every command of this executor."""
        sup = self.support
        tree, runtime = str(self.tree), str(self._runtime)
        if sup.launcher and self._host_uid is not None:  # the launcher's stage
            tree, runtime = f"{STAGE}/w", f"{STAGE}/r"
        argv = [sup.bwrap]
        if sup.userns:
            argv += ["--unshare-user", "--uid", str(UID), "--gid", str(UID)]
        argv += ["--cap-drop", "ALL"]
        if sup.no_userns:
            argv.append("--disable-userns")
        if sup.seccomp and sup.launcher:
            argv += ["--seccomp", str(SECCOMP_FD)]
        argv += [*NAMESPACE_FLAGS, "--die-with-parent", "--new-session", "--hostname", "sandbox"]
        argv += bwrap_fs_args(tree, runtime, self.limits.tmp_mb << 20, sup.proc_entries,
                              preload=bool(self._preload_libs(inside=True)))
        staged = sup.launcher and self._host_uid is not None
        for i, (src, dest, *rw) in enumerate(self.binds):
            argv += ["--bind" if rw == ["rw"] else "--ro-bind", f"{STAGE}/x{i}" if staged else src, dest]
        return argv


class _Running:
    """A started command: its pid, and how to poll, wait for and kill it."""

    def __init__(self, pid: int, popen: subprocess.Popen | None = None,
                 spawner: Spawner | None = None, cgroup: ExecutorCgroup | None = None):
        self.pid, self.popen, self.spawner, self.cgroup = pid, popen, spawner, cgroup
        self.status: int | None = None

    def poll(self) -> int | None:
        if self.status is None:
            self.status = self.popen.poll() if self.popen is not None else self.spawner.poll()
        return self.status

    def wait(self) -> int:
        if self.status is None:
            self.status = self.popen.wait() if self.popen is not None else self.spawner.wait()
        return self.status

    def kill(self) -> None:
        kill_group(self.pid)  # bwrap dies; --die-with-parent and the PID namespace take the rest
        if self.cgroup is not None:
            self.cgroup.kill_all(spare=self.spawner.pid if self.spawner else None)


class _Watch:
    """Checked by the pump every WATCH_EVERY_S while a command runs, and once after: the
    memory cgroup's kills, the tree's size against its quota, and whether /tmp or /dev/shm
    is full."""

    def __init__(self, ex: Executor, proc: "_Running", started_ns: int, oom_before: int):
        self.tree = str(ex.tree)
        self.quota = ex.limits.tree_mb << 20
        self.file_limit = min(ex.limits.file_size_mb, ex.limits.tree_mb) << 20  # RLIMIT_FSIZE
        self.since_ns = started_ns - SLACK_NS
        self.proc = proc
        self.oom_before = oom_before
        self.inner: int | None = None  # the sandbox's first process (bwrap's child)
        self.tmp_full = False

    def _inner(self) -> int | None:
        if self.inner is None:
            try:
                with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                    kids = f.read().split()
                self.inner = int(kids[0]) if kids else None
            except (OSError, ValueError):
                return None
        return self.inner

    def _full(self) -> bool:
        pid = self._inner()
        if pid is None:
            return False
        for mount in ("tmp", "dev/shm"):
            try:
                st = os.statvfs(f"/proc/{pid}/root/{mount}")
            except OSError:
                return False
            if st.f_bavail * st.f_frsize < 64 * 1024:
                return True
        return False

    def _oom(self) -> bool:
        cgroup = self.proc.cgroup
        return cgroup is not None and cgroup.oom_kills() > self.oom_before


    def __call__(self) -> str | None:
        if self._oom():
            return "memory"
        if tree_bytes(self.tree, stop_above=self.quota) > self.quota:
            return "tree-quota"
        if not self.tmp_full and self._full():
            self.tmp_full = True  # not stopped for it: the command sees ENOSPC and goes on
        return None

    def after(self, stderr: str, code: int, tmp_full: bool, sizes: "_Sizes | None" = None) -> str | None:
        """The limit a command that ran to its end hit, if any. `code`: its exit status;
        `tmp_full`: the exit trap found no room in /tmp or /dev/shm; `sizes`: the tree as
        the clamping walk saw it (else it is walked here)."""
        if self._oom():
            return "memory"
        if sizes is None:
            sizes = _Sizes(self)
            for _, _, st in _walk(self.tree):
                sizes.add(st)
        if sizes.total > self.quota:
            return "tree-quota"
        if self.tmp_full or tmp_full:
            return "tmp-full"
        if "File too large" in stderr or code == 128 + signal.SIGXFSZ or sizes.at_limit:
            return "file-size"
        return None


class _Sizes:
    """The tree after a command, from each entry's lstat: its size as tree_bytes counts it,
    and whether a regular file written during the command (its mtime, not yet clamped, in
    the command's window) stands at the largest size a command may write: how a file-size
    hit shows when the command hid its stderr."""

    def __init__(self, watch: _Watch):
        self.limit, self.since_ns = watch.file_limit, watch.since_ns
        self.until_ns = time.time_ns() + SLACK_NS
        self.total, self.at_limit = 0, False

    def add(self, st: os.stat_result) -> None:
        if stat.S_ISREG(st.st_mode):
            self.total += st.st_size
            if st.st_size == self.limit and self.since_ns <= st.st_mtime_ns <= self.until_ns:
                self.at_limit = True
        elif stat.S_ISDIR(st.st_mode):
            self.total += st.st_size


def _cleanup(spawner: Spawner | None, cgroup: ExecutorCgroup | None) -> None:
    if spawner is not None:
        spawner.close()
    if cgroup is not None:
        cgroup.close()
