"""The sandbox's processes, limits and leftovers, against the real sandbox as whoever runs
the tests (root in CI): what a command started dies with its recorder, its processes'
memory is bounded together, only the address families a shell needs exist, a file-size
hit is seen whatever the command did with stderr, and a killed recorder's files go."""

from __future__ import annotations

import errno
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tttr.recorders.filetimes import clamp_times
from tttr.recorders.limits import Limits
from tttr.recorders.probe import probe
from tttr.recorders.sandbox import Executor
from tttr.recorders.scratch import remove_tree, scratch_dir, sweep
from tests.sandbox_helpers import CLOCK, needs_sandbox

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def tree(tmp_path):
    t = tmp_path / "tree"
    t.mkdir()
    return t


def _with_marker(marker: str) -> list[int]:
    """The pids whose command line holds `marker` (bwrap, the shell, its children)."""
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        pids.append(int(name))
            except OSError:
                pass
    return pids


def _wait_for(check, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return check()


@needs_sandbox
def test_a_commands_children_die_with_a_recorder_killed_with_sigkill(tree):
    marker = f"300.{secrets.randbelow(10**9):09d}"  # a sleep of 300 s that no other process has
    code = ("from datetime import datetime; from tttr.recorders.limits import Limits; "
            "from tttr.recorders.sandbox import Executor; "
            f"ex = Executor({str(tree)!r}, limits=Limits(timeout_s=600)); print('ready', flush=True); "
            f"ex.run('sleep {marker} & sleep {marker}', datetime(2026, 3, 2))")
    recorder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert recorder.stdout.readline() == "ready\n"
        # bwrap and its monitor, the shell, the two sleeps
        assert _wait_for(lambda: len(_with_marker(marker)) >= 4, 30), _with_marker(marker)
        recorder.kill()
        recorder.wait()
        assert _wait_for(lambda: not _with_marker(marker), 10), f"left running: {_with_marker(marker)}"
    finally:
        recorder.kill()
        for pid in _with_marker(marker):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


@needs_sandbox
@pytest.mark.skipif(not probe().pids_cgroup, reason="no writable pids cgroup here")
def test_a_stale_cgroup_is_emptied_before_it_is_removed(tree):
    from tttr.recorders.limits import ExecutorCgroup

    root = Path(probe().pids_cgroup)
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = root / f"tttr-{dead.pid}-1"
    foreign = root / f"tttr-{dead.pid}-2-1"  # a recorder of another PID namespace: its pid means nothing here
    stale.mkdir()
    foreign.mkdir()
    left = subprocess.Popen(["sleep", "300"])  # what a killed recorder's command left running
    try:
        (stale / "cgroup.procs").write_text(str(left.pid))
        ExecutorCgroup(root, 64).close()
        assert left.wait(timeout=10) == -9
        assert not stale.exists() and foreign.exists()
    finally:
        left.kill()
        for cg in (stale, foreign):
            if cg.exists():
                cg.rmdir()


@needs_sandbox
@pytest.mark.skipif(not probe().memory_cgroup, reason=probe().line())
def test_the_memory_of_all_a_commands_processes_is_bounded_together(tree):
    # four processes of 100 MB, each under its own 200 MB RLIMIT_AS; together past 256 MB
    hog = "python3 -c 'import time; b = bytearray(100 << 20); time.sleep(20)'"
    with Executor(tree, limits=Limits(memory_mb=200, memory_total_mb=256, timeout_s=60)) as ex:
        r = ex.run(f"for i in 1 2 3 4; do {hog} & done; wait; echo FINISHED", CLOCK)
        assert r.limit_hit == "memory" and not r.timed_out, (r.limit_hit, r.stderr)
        assert r.exit_code != 0 and "FINISHED" not in r.stdout
        assert "[tttr: the command's processes went past the 256 MB they may hold together" in r.stderr
        assert "memory-cgroup" in r.mechanisms
        # one of them alone is fine, and the next command starts afresh
        r = ex.run(hog.replace("time.sleep(20)", "print(len(b))"), CLOCK)
        assert r.limit_hit is None and r.stdout == f"{100 << 20}\n", r.stderr


@pytest.mark.parametrize("bad", [0, 63, -1])
def test_the_total_memory_limit_is_checked(bad):
    from tttr.recorders.errors import SandboxError

    with pytest.raises(SandboxError) as info:
        Limits(memory_total_mb=bad)
    assert "memory_total_mb" in str(info.value)


SOCKETS = r"""
import errno, socket
for name in ("AF_VSOCK", "AF_PACKET", "AF_ALG", "AF_BLUETOOTH", "AF_UNSPEC"):
    family = getattr(socket, name)
    try:
        socket.socket(family, socket.SOCK_DGRAM if name == "AF_PACKET" else socket.SOCK_STREAM).close()
        print(name, "OPENED")
    except OSError as exc:
        print(name, errno.errorcode[exc.errno])
for name in ("AF_VSOCK", "AF_INET"):
    try:
        socket.socketpair(getattr(socket, name), socket.SOCK_STREAM)
        print("pair", name, "OPENED")
    except OSError as exc:
        print("pair", name, errno.errorcode[exc.errno])
for family in (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK):
    socket.socket(family, socket.SOCK_DGRAM).close()
a, b = socket.socketpair()
a.sendall(b"unix ok")
print(b.recv(16).decode())
"""


@needs_sandbox
@pytest.mark.skipif(not probe().seccomp, reason=probe().line())
def test_only_the_address_families_a_shell_needs_exist(tree):
    (tree / "sockets.py").write_text(SOCKETS)
    with Executor(tree) as ex:
        r = ex.run("python3 sockets.py", CLOCK)
    assert r.exit_code == 0, r.stderr
    seen = dict(line.rsplit(" ", 1) for line in r.stdout.splitlines())
    for name in ("AF_VSOCK", "AF_PACKET", "AF_ALG", "AF_BLUETOOTH", "AF_UNSPEC", "pair AF_VSOCK"):
        assert seen[name] == errno.errorcode[errno.EAFNOSUPPORT], (name, r.stdout)
    assert seen["pair AF_INET"] != "OPENED"  # the kernel's own refusal
    assert seen["unix"] == "ok"


@needs_sandbox
@pytest.mark.parametrize("command", [
    "dd if=/dev/zero of=big bs=1M count=8 2>/dev/null; true",
    "exec 2>/dev/null; head -c 9000000 /dev/zero > big",
    "python3 -c 'open(\"big\", \"wb\").write(bytes(9 << 20))' 2>/dev/null; true",
])
def test_a_file_size_hit_is_seen_when_the_command_hides_stderr(tree, command):
    with Executor(tree, limits=Limits(file_size_mb=4)) as ex:
        r = ex.run(command, CLOCK)
        assert r.limit_hit == "file-size", (r.exit_code, r.stderr)
        assert (tree / "big").stat().st_size == 4 << 20
        assert "[tttr: a file reached the 4 MB a command may write]" in r.stderr
        # the file stays at that size; a later command that leaves it alone hit nothing
        assert ex.run("ls -l big > /dev/null", CLOCK).limit_hit is None


def _nest(path: str, depth: int) -> int:
    """`depth` nested directories `d` under `path`, made by descriptor (their path is past
    PATH_MAX); the innermost's descriptor."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    return fd


def test_clamping_file_times_walks_any_depth(tmp_path):
    tree = tmp_path / "tree"
    path = str(tree)
    os.mkdir(path)
    fd = _nest(path, 1100)
    try:
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("deep")
        epoch = 1_700_000_000
        now = time.time_ns()
        assert clamp_times(path, now - 10**9, now + 10**9, epoch) >= 1101
        assert os.stat("f", dir_fd=fd).st_mtime == epoch
    finally:
        os.close(fd)
    assert os.stat(path).st_mtime == epoch and os.stat(tree / "d").st_mtime == epoch
    remove_tree(path)
    assert not tree.exists()


def test_clamping_file_times_never_follows_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.write_text("host")
    before = outside.stat().st_mtime_ns
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "link").symlink_to(outside)
    (tree / "dirlink").symlink_to(tmp_path)
    now = time.time_ns()
    clamp_times(str(tree), now - 10**12, now + 10**9, 1_700_000_000)
    assert outside.stat().st_mtime_ns == before
    assert os.lstat(tree / "link").st_mtime == 1_700_000_000


@needs_sandbox
@pytest.mark.skipif(not ROOT, reason="the tree changes owner only when TTTR runs as root")
def test_sandbox_exec_hands_the_tree_back_to_its_owner(tmp_path):
    tree = tmp_path / "mine"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "old").write_text("before\n")
    for p in (tree, tree / "sub", tree / "sub" / "old"):
        os.chown(p, 4242, 4343)
    out = subprocess.run([sys.executable, "-m", "tttr.app", "sandbox", "exec", "--tree", str(tree), "--",
                          "echo new > sub/new; mkdir made; echo more >> sub/old"],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for p in (tree, tree / "sub", tree / "sub" / "old", tree / "sub" / "new", tree / "made"):
        st = p.stat()
        assert (st.st_uid, st.st_gid) == (4242, 4343), p


def test_a_killed_processs_scratch_directories_are_swept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    base = str(tmp_path)
    stale = tmp_path / f"tttr-t-{dead.pid}-abc"
    (stale / "tree").mkdir(parents=True)
    os.close(_nest(str(stale / "tree"), 1100))  # a program's tree can be that deep
    mine = tmp_path / f"tttr-t-{os.getpid()}-abc"
    mine.mkdir()
    other = tmp_path / "tttr-t-tree-1-abc"  # another prefix that starts the same
    other.mkdir()
    (tmp_path / f"tttr-t-{dead.pid}-link").symlink_to(mine)
    made = scratch_dir("tttr-t-", base)
    assert made.parent == tmp_path and made.name.startswith(f"tttr-t-{os.getpid()}-") and made.is_dir()
    assert not stale.exists() and mine.exists() and other.exists()
    assert (tmp_path / f"tttr-t-{dead.pid}-link").is_symlink()
    assert sweep("tttr-t-", base) == []


@needs_sandbox
def test_a_recorder_killed_with_sigkill_leaves_no_run_tree(tmp_path):
    code = ("from tttr.engine.replay.world import World; "
            "w = World(store=None, task=None, seed=0, executor_factory=None, log=None); "
            "print(w._workdir, flush=True); import time; time.sleep(300)")
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    recorder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True, env=env)
    workdir = Path(recorder.stdout.readline().strip())
    recorder.kill()
    recorder.wait()
    assert workdir.parent == tmp_path and workdir.name.startswith(f"tttr-run-{recorder.pid}-") and workdir.is_dir()
    subprocess.run([sys.executable, "-c", code.replace("time.sleep(300)", "pass")], cwd=REPO, env=env,
                   capture_output=True, check=True)
    assert not workdir.exists()
