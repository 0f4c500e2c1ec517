"""What a sandboxed command cannot do, and the limits that stop it."""

from __future__ import annotations

import os
import resource
import socket
import time

import pytest

from tttr.recorders.limits import Limits
from tttr.recorders.sandbox import Executor
from tests.sandbox_helpers import CLOCK, needs_sandbox

pytestmark = needs_sandbox


@pytest.fixture
def tree(tmp_path):
    t = tmp_path / "tree"
    t.mkdir()
    return t


def test_cannot_read_or_write_a_sentinel_outside(tmp_path, tree):
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("secret")
    os.chmod(sentinel, 0o666)
    with Executor(tree) as ex:
        for path in (str(sentinel), str(sentinel.resolve())):
            r = ex.run(f"cat {path}; echo pwned > {path}; ls {os.path.dirname(path)}", CLOCK)
            assert "secret" not in r.stdout
        r = ex.run("cat ../sentinel.txt; echo pwned > /work/../sentinel.txt; echo x > /usr/evil; echo x > /etc/evil", CLOCK)
        assert "secret" not in r.stdout
        assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr
    assert sentinel.read_text() == "secret"
    assert not os.path.exists("/usr/evil") and not os.path.exists("/etc/evil")
    # the host's home and the repository are not there at all
    with Executor(tree) as ex:
        r = ex.run("ls /root /home " + os.getcwd() + " 2>&1; cat /etc/shadow 2>&1 | head -1", CLOCK)
    assert "No such file" in r.stdout


def test_no_network(tree):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        with Executor(tree) as ex:
            r = ex.run(f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\" "
                       "2>&1; echo rc=$?; cat /sys/class/net/*/address 2>/dev/null; ls /sys/class/net 2>/dev/null; "
                       "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\" 2>&1 | tail -1",
                       CLOCK)
    finally:
        server.close()
    assert "rc=1" in r.stdout
    assert "Connection refused" in r.stdout or "unreachable" in r.stdout.lower()


def test_cannot_see_host_processes(tree):
    marker = f"tttr-host-marker-{os.getpid()}"
    import subprocess

    host = subprocess.Popen(["sleep", "30"], env={"MARK": marker})
    try:
        with Executor(tree) as ex:
            r = ex.run(f"ps -e -o pid,comm; ls /proc | grep -c '^[0-9]'; kill -0 {host.pid} 2>&1; echo rc=$?", CLOCK)
    finally:
        host.kill()
        host.wait()
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["PID", "COMMAND"]
    assert {l.split()[1] for l in lines[1:4]} <= {"bwrap", "bash", "ps"}
    assert "sleep" not in r.stdout
    assert r.stdout.strip().endswith("rc=1")


def test_infinite_loop_is_stopped(tree):
    with Executor(tree, limits=Limits(timeout_s=1.5)) as ex:
        t0 = time.monotonic()
        r = ex.run("while :; do :; done", CLOCK)
        assert time.monotonic() - t0 < 6
        assert r.timed_out and r.exit_code == 124 and "timeout" in r.stderr
        assert ex.run("echo alive", CLOCK).stdout == "alive\n"


def test_fork_bomb_is_stopped(tree):
    with Executor(tree, limits=Limits(timeout_s=3, max_processes=64)) as ex:
        if not ({"pids-cgroup", "rlimit-nproc"} & set(ex.mechanisms)):
            pytest.skip("no process limit on this machine (root without a pids cgroup)")
        t0 = time.monotonic()
        r = ex.run("bomb() { bomb | bomb & }; bomb; sleep 2; echo survived", CLOCK)
        assert time.monotonic() - t0 < 15
        assert "Resource temporarily unavailable" in r.stderr or r.timed_out
        assert ex.run("echo alive", CLOCK).stdout == "alive\n"


def test_memory_limit(tree):
    with Executor(tree, limits=Limits(memory_mb=256)) as ex:
        r = ex.run("python3 -c 'x = bytearray(600 * 1024 * 1024)'", CLOCK)
    assert r.exit_code != 0 and "MemoryError" in r.stderr


def test_hundred_megabytes_of_output_is_counted_not_kept(tree):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    with Executor(tree) as ex:
        r = ex.run("head -c 100000000 /dev/zero | tr '\\0' x; echo; echo done >&2", CLOCK)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert r.exit_code == 0
    assert r.truncated and r.stdout_size == 100_000_001
    assert len(r.stdout) < 70_000 and "[output truncated: 100000001 bytes in total" in r.stdout
    assert r.stderr == "done\n"
    assert after - before < 50_000, f"peak memory grew by {after - before} KiB"
