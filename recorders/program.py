"""The sandbox side of recording a whole program (`tttr record -- PROGRAM ARG...`).

The program runs in the trace layer's sandbox like one agent command, with three additions:

- The host's Python (its prefix, with site-packages) is bound read-only at its own path and
  its `bin` directory leads PATH, so `python3 prog.py` runs with the packages it has outside.
  tttr's source (an editable install) is bound too, so the program can import the SDK: at its
  own path, or, where the tree's mount would hide it, at SOURCE_DIR with a `tttr` of links
  to it first on PYTHONPATH.
- Its only way out is the model endpoint. The sandbox has its own network namespace with
  nothing but loopback; the server listens on a Unix socket in a host directory that is bound
  read-only into the sandbox at API_DIR, and a small forwarder started before the program
  listens on 127.0.0.1:PORT inside and relays each connection to that socket. The program
  gets `OPENAI_BASE_URL=http://127.0.0.1:PORT/v1`.
- Its working tree is guarded by size before anything runs.

Unsafe mode (no namespaces) has no private loopback: the program is pointed at the server's
own TCP address on the host instead, and no forwarder runs.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from tttr.recorders.errors import SandboxError
from tttr.recorders.rootfs import PROGRAM_DIRS, SANDBOX_ROOT
from tttr.recorders.sandbox import PATH
from tttr.recorders.treeio import lstat_beneath
from tttr.recorders.treeown import tree_bytes

API_DIR = "/run/tttr-api"        # the host's socket directory, inside the sandbox
SOCKET_NAME = "api.sock"
FORWARDER_NAME = "forward.py"
PORT = 8710                       # inside the sandbox's own network namespace: always free
MAX_TREE_MB = 256

# Listens on 127.0.0.1:PORT, then forks: the child relays every connection to the Unix
# socket (one thread per direction), the parent exits 0 once the port accepts, so the
# program starts only when its endpoint is up. The relay dies with the sandbox.
FORWARDER = r'''
import os, socket, sys, threading
port, path = int(sys.argv[1]), sys.argv[2]
lsn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lsn.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lsn.bind(("127.0.0.1", port))
lsn.listen(64)
if os.fork():
    os._exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)

def pipe(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

def serve(conn):
    # each chunk relayed at once: Nagle's wait for the client's delayed ACK held every second
    # chunk of an answer (uvicorn writes head and body apart) 40 ms
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        conn.close()
        return
    threading.Thread(target=pipe, args=(up, conn), daemon=True).start()
    pipe(conn, up)

while True:
    conn, _ = lsn.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
'''


class ProgramError(SandboxError):
    """A program that cannot be recorded as given (missing, empty, tree too large)."""


SOURCE_DIR = "/run/tttr-src"      # tttr's source, when it lies where the tree is mounted
PACKAGES_DIR = f"{API_DIR}/pkg"    # a `tttr` of links into SOURCE_DIR, put on PYTHONPATH then


@dataclass(frozen=True, slots=True)
class HostPython:
    """The host's Python as the program sees it: directories bound read-only at their own
    path, the directory of its executables, put first on PATH, and tttr's own source so that
    the program can import the SDK (`tttr.recorders.sdk`)."""

    dirs: tuple[str, ...]          # bound at their own path
    bin_dir: str
    source: str | None = None      # tttr's source, bound at SOURCE_DIR (an editable install under /work)
    packages: tuple[str, ...] = ()  # tttr's subpackages in `source`

    @classmethod
    def current(cls) -> HostPython:
        dirs: list[str] = []
        # A wheel's tttr sits in site-packages, under the prefix; an editable install's
        # source is bound at its own path too, or at SOURCE_DIR where the tree would hide it.
        here = os.path.realpath(Path(__file__).resolve().parents[1])
        for d in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, here):
            d = os.path.realpath(d)
            if any(d == p or d.startswith(p + "/") for p in (*dirs, *PROGRAM_DIRS)):
                continue  # a prefix under /usr is already there
            if d == SANDBOX_ROOT or d.startswith(SANDBOX_ROOT + "/") or d.startswith("/run/") or d == "/":
                continue
            dirs.append(d)
        source = None
        if not any(here == d or here.startswith(d + "/") for d in (*dirs, *PROGRAM_DIRS)):
            source = here
        packages = tuple(sorted(n for n in ("app", "assets", "engine", "kernels", "recorders", "sessions")
                                if source and os.path.isdir(os.path.join(source, n))))
        return cls(dirs=tuple(dirs), bin_dir=os.path.dirname(sys.executable), source=source, packages=packages)

    @property
    def path(self) -> str:
        return f"{self.bin_dir}:{PATH}"

    def binds(self, api: Path) -> tuple[tuple[str, str], ...]:
        """(host directory, path inside) for the executor, `api` the socket's directory."""
        out = [(d, d) for d in self.dirs] + [(str(api), API_DIR)]
        if self.source:
            out.append((self.source, SOURCE_DIR))
        return tuple(out)

    def env(self) -> dict[str, str]:
        env = {"PATH": self.path}
        if self.source:
            env["PYTHONPATH"] = PACKAGES_DIR
        return env

    def write_packages(self, api: Path) -> None:
        """In `api`: pkg/tttr/NAME -> SOURCE_DIR/NAME, the layout an installed tttr has."""
        if not self.source:
            return
        pkg = api / "pkg" / "tttr"
        pkg.mkdir(parents=True, exist_ok=True)
        for name in self.packages:
            os.symlink(f"{SOURCE_DIR}/{name}", pkg / name)
        for d in (api / "pkg", pkg):
            os.chmod(d, 0o755)


def check_program(argv: list[str], tree: Path, host: HostPython) -> str:
    """The program's command line (shlex-joined), or ProgramError with one line when it
    cannot start: no words, or a first word that is neither a file in the tree nor a
    command on the sandbox's PATH."""
    if not argv or not argv[0].strip():
        raise ProgramError("no program given: put it after --, e.g. tttr record -- python3 agent.py")
    if any("\0" in a for a in argv):
        raise ProgramError("the program's arguments hold a NUL byte; remove it")
    prog = argv[0]
    if "/" in prog:
        rel = _in_tree(prog)
        if rel is None:  # a host program (/usr/bin/...), seen in the sandbox at its own path
            st = os.stat(prog) if os.path.exists(prog) else None
        else:  # in the tree, which the program may fill with links: looked at, never followed
            st = lstat_beneath(str(tree), rel)
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise ProgramError(f"program {prog!r} is a directory: give the program to run in it")
        regular = st is not None and stat.S_ISREG(st.st_mode)
        if regular and not st.st_mode & 0o111:  # there, but it cannot be run: "not found" would mislead
            raise ProgramError(f"program {prog!r} is not executable: chmod +x it, or name its interpreter "
                               f"first (e.g. tttr record -- python3 {prog})")
        found = st is not None and (regular or stat.S_ISLNK(st.st_mode))  # a link is the sandbox's to resolve
    else:
        found = shutil.which(prog, path=host.path) is not None
    if not found:
        raise ProgramError(
            f"program {prog!r} not found: give a command on PATH ({host.bin_dir} first) or an executable "
            f"file in the tree (--tree {tree})"
        )
    script = argv[1] if len(argv) > 1 and PYTHON.fullmatch(os.path.basename(prog)) else None
    if script is not None and script.endswith(".py") and not _visible(script, tree, host):
        raise ProgramError(
            f"script {script!r} is not in the tree: the program runs in --tree {tree} (at {SANDBOX_ROOT}); "
            "copy it there or pass --tree DIR that holds it"
        )
    return shlex.join(argv)


PYTHON = re.compile(r"python[0-9.]*")


def _in_tree(path: str) -> str | None:
    """`path` as the program names it from /work, relative to its tree; None for a path
    outside the tree."""
    if not path.startswith("/"):
        return path
    if path.startswith(SANDBOX_ROOT + "/"):
        return path[len(SANDBOX_ROOT) + 1:]
    return None


def _visible(path: str, tree: Path, host: HostPython) -> bool:
    """Whether `path`, as the program names it from /work, is a file inside the sandbox."""
    rel = _in_tree(path)
    if rel is not None:
        st = lstat_beneath(str(tree), rel)
        return st is not None and (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode))
    shown = (*host.dirs, *PROGRAM_DIRS)
    return os.path.isfile(path) and any(path.startswith(d.rstrip("/") + "/") for d in shown)


def check_tree(tree: Path, limit_mb: int = MAX_TREE_MB) -> None:
    """Refuse a working tree over `limit_mb` (it is snapshotted at the start and the end)."""
    limit = limit_mb << 20
    size = tree_bytes(str(tree), stop_above=limit)
    if size > limit:
        raise ProgramError(f"tree {tree} holds more than {limit_mb} MiB; pass a smaller --tree (or an empty one)")


def api_dir(root: Path, host: HostPython) -> Path:
    """Make the directory the server's socket, the forwarder and the links to tttr's source
    live in (readable and searchable by the sandbox's unprivileged uid)."""
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    fwd = root / FORWARDER_NAME
    fwd.write_text(FORWARDER)
    os.chmod(fwd, 0o644)
    host.write_packages(root)
    return root


def endpoint_env(base: str, run_name: str) -> dict[str, str]:
    """What the program is told about its model endpoint (`base`: scheme, host and port)."""
    # Nothing but the model is reachable from the sandbox: the Agents SDK's trace upload and
    # LiteLLM's fetch of its model price list (retried for seconds) are turned off.
    return {"OPENAI_BASE_URL": f"{base}/v1", "OPENAI_API_KEY": "tttr", "OPENAI_AGENTS_DISABLE_TRACING": "1",
            "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "tttr",  # the `anthropic` client adds /v1/messages
            "LITELLM_LOCAL_MODEL_COST_MAP": "True", "TTTR_RECORDER_URL": base, "TTTR_RUN": run_name}


def sandboxed_command(program: str, host: HostPython) -> str:
    """The shell line run in the sandbox: the forwarder, then the program."""
    fwd = shlex.join([f"{host.bin_dir}/python3" if os.path.exists(f"{host.bin_dir}/python3") else sys.executable,
                      "-I", "-S", f"{API_DIR}/{FORWARDER_NAME}", str(PORT), f"{API_DIR}/{SOCKET_NAME}"])
    return f"{fwd} && {program}"
