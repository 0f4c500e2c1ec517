"""A small process that lives inside the executor's cgroup and starts each command for
it. Moving a process into a cgroup costs ~15 ms here (cgroup v1 takes a global lock with
an RCU sync); children of a process already inside inherit the cgroup for free. So the
cgroup is joined once, by this spawner, not once per command.

The spawner dies with the recorder (a parent-death signal, SIGKILL), and bwrap
(`--die-with-parent`) with the spawner, so a recorder killed with SIGKILL takes its
commands with it. The signal is tied to the thread that started the spawner: if that
thread ends first, the spawner goes with it and the executor's next command starts a
new one.

Protocol over a socket pair: the executor sends {"argv", "env"} with three descriptors
(stdout, stderr, state channel) and gets back {"pid"} at once and {"status"} when the
command exits.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading

from tttr.recorders.errors import SandboxError

STATE_FD = 3   # where the command finds its state channel

SERVER = r"""
import ctypes, fcntl, json, os, socket, sys
ctypes.CDLL(None).prctl(1, 9, 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL: die with the recorder
if os.getppid() != int(sys.argv[2]):  # it died before the signal was asked for
    os._exit(1)
for procs in sys.argv[3:]:  # join the executor's cgroup (one cgroup.procs per hierarchy)
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
fd = fcntl.fcntl(int(sys.argv[1]), fcntl.F_DUPFD_CLOEXEC, 100)
os.close(int(sys.argv[1]))
s = socket.socket(fileno=fd)
buf = b""
while True:
    try:
        msg, fds, _, _ = socket.recv_fds(s, 1 << 22, 3)
    except OSError:
        break
    if not msg:
        break
    req = json.loads(msg)
    for target, src in zip((10, 11, 12), fds):
        os.dup2(src, target, inheritable=False)
        os.close(src)
    acts = [(os.POSIX_SPAWN_DUP2, 10, 1), (os.POSIX_SPAWN_DUP2, 11, 2), (os.POSIX_SPAWN_DUP2, 12, 3),
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)]
    try:
        pid = os.posix_spawn(req["argv"][0], req["argv"], req["env"], file_actions=acts, setsid=True)
        reply = {"pid": pid}
    except OSError as exc:
        pid, reply = None, {"error": str(exc)}
    for t in (10, 11, 12):
        os.close(t)
    s.sendall(json.dumps(reply).encode() + b"\n")
    if pid is not None:
        _, status = os.waitpid(pid, 0)
        s.sendall(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
"""


class Spawner:
    def __init__(self, cgroup_procs: list[str]):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", SERVER, str(child.fileno()), str(os.getpid()), *cgroup_procs],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
        except OSError as exc:
            parent.close()
            raise SandboxError(f"cannot start the command spawner: {exc}") from None
        finally:
            child.close()
        self.sock = parent
        self.lock = threading.Lock()
        self._buf = b""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _line(self, timeout: float | None) -> dict | None:
        while b"\n" not in self._buf:
            if timeout is not None and not select.select([self.sock], [], [], timeout)[0]:
                return None
            chunk = self.sock.recv(65536)
            if not chunk:
                raise SandboxError("the command spawner died; the next command starts a new one")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def spawn(self, argv: list[str], env: dict[str, str], fds: tuple[int, int, int]) -> int:
        socket.send_fds(self.sock, [json.dumps({"argv": argv, "env": env}).encode()], list(fds))
        reply = self._line(None)
        if "error" in reply:
            raise SandboxError(f"cannot start the sandbox ({argv[0]}): {reply['error']}")
        return int(reply["pid"])

    def poll(self) -> int | None:
        """The exit status once the command has exited, else None (never blocks)."""
        reply = self._line(0)
        return None if reply is None else int(reply["status"])

    def wait(self) -> int:
        return int(self._line(None)["status"])

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGKILL)
                self.proc.wait()


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
