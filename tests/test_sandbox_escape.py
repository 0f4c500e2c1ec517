"""Escape probes against the real sandbox, run as whoever runs the tests (root in CI): a
command must not change anything of the host outside its tree, whoever runs TTTR."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tttr.recorders.errors import SandboxError
from tttr.recorders.limits import ExecutorCgroup, Limits
from tttr.recorders.probe import probe
from tttr.recorders.sandbox import Executor
from tests.sandbox_helpers import CLOCK, needs_sandbox

pytestmark = needs_sandbox
ROOT = os.geteuid() == 0
X86_64 = platform.machine() == "x86_64"
REPO = Path(__file__).resolve().parent.parent

PROC_SYS = ("kernel/printk_ratelimit", "kernel/core_pattern", "vm/drop_caches", "kernel/panic")


@pytest.fixture
def tree(tmp_path):
    t = tmp_path / "tree"
    t.mkdir()
    return t


def _host(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def test_proc_sys_is_not_writable_and_the_host_keeps_its_values(tree):
    before = {name: _host(f"/proc/sys/{name}") for name in PROC_SYS}
    probes = "; ".join(f"test -w /proc/sys/{n} && echo WRITABLE {n}; echo 6 > /proc/sys/{n} && echo WROTE {n}"
                       for n in PROC_SYS)
    with Executor(tree) as ex:
        r = ex.run(probes + "; echo 1 > /proc/sysrq-trigger && echo WROTE sysrq; true", CLOCK)
    assert "WRITABLE" not in r.stdout and "WROTE" not in r.stdout, r.stdout
    assert r.stderr.count("Read-only file system") + r.stderr.count("Permission denied") >= len(PROC_SYS)
    assert {name: _host(f"/proc/sys/{name}") for name in PROC_SYS} == before


def test_the_command_runs_as_an_unprivileged_host_uid(tree):
    with Executor(tree) as ex:
        r = ex.run("echo x > made; id -u; cat /proc/self/uid_map", CLOCK)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split()[0] == "1000"
    owner = (tree / "made").stat().st_uid
    assert owner != 0
    if ROOT:
        assert owner == probe().host_uid and "unprivileged-uid" in r.mechanisms
    else:
        assert owner == os.geteuid()


def test_no_capabilities_and_no_new_user_namespaces(tree):
    with Executor(tree) as ex:
        r = ex.run("grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status; unshare -U true && echo UNSHARED-U; "
                   "unshare -r true && echo UNSHARED-R; mount -t tmpfs none /tmp && echo MOUNTED; "
                   "mount --bind /work /mnt 2>/dev/null && echo BOUND; true", CLOCK)
    caps = dict(line.split(":\t") for line in r.stdout.splitlines() if line.startswith("Cap"))
    assert caps and all(int(v, 16) == 0 for v in caps.values()), caps
    for word in ("UNSHARED", "MOUNTED", "BOUND"):
        assert word not in r.stdout
    assert "cap-drop" in r.mechanisms


SECCOMP_PROBE = r"""
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
calls = {
    "mount": (165, b"none", b"/tmp", b"tmpfs", 0, 0), "umount2": (166, b"/tmp", 0), "pivot_root": (155, b"/", b"/"),
    "ptrace": (101, 16, 1, 0, 0), "process_vm_readv": (310, 1, 0, 0, 0, 0, 0),
    "kexec_load": (246, 0, 0, 0, 0), "init_module": (175, 0, 0, b""), "finit_module": (313, 0, b"", 0),
    "delete_module": (176, b"x", 0), "add_key": (248, b"user", b"k", b"v", 1, -4),
    "request_key": (249, b"user", b"k", 0, 0), "keyctl": (250, 0, -4, 0),
    "unshare": (272, 0x10000000), "setns": (308, 0, 0), "clone-newuser": (56, 0x10000000 | 17, 0, 0, 0, 0),
    "bpf": (321, 0, 0, 0), "perf_event_open": (298, 0, 0, -1, -1, 0), "reboot": (169, 0, 0, 0, 0),
    "swapon": (167, b"/x", 0), "swapoff": (168, b"/x"), "settimeofday": (164, 0, 0), "clock_settime": (227, 0, 0),
    "adjtimex": (159, 0), "acct": (163, 0), "quotactl": (179, 0, 0, 0, 0), "userfaultfd": (323, 0),
    "open_by_handle_at": (304, 0, 0, 0), "personality-read-implies-exec": (135, 0x0400000),
    "io_uring_setup": (425, 1, 0),
}
for name, (nr, *args) in calls.items():
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    print(name, rc, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
ctypes.set_errno(0)
rc = libc.syscall(ctypes.c_long(318), ctypes.create_string_buffer(8), ctypes.c_long(8), ctypes.c_long(0))
print("getrandom", rc, errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno()))
print("personality-query", libc.personality(ctypes.c_ulong(0xFFFFFFFF)))
"""


@pytest.mark.skipif(not X86_64, reason="the probe uses x86_64 system call numbers")
@pytest.mark.skipif(not probe().seccomp, reason=probe().line())
def test_seccomp_refuses_what_a_shell_never_needs(tree):
    (tree / "probe.py").write_text(SECCOMP_PROBE)
    with Executor(tree) as ex:
        r = ex.run("python3 probe.py; setarch -R true && echo SETARCH-OK", CLOCK)
    assert r.exit_code == 0, r.stderr
    results = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if " " in line}
    for name, (rc, err) in ((k, v) for k, v in results.items() if k not in ("getrandom", "personality-query")):
        assert (rc, err) == ("-1", "EPERM"), f"{name}: {rc} {err}"
    assert results["getrandom"] == ["-1", "ENOSYS"]
    assert results["personality-query"] != ["-1"]
    assert "SETARCH-OK" in r.stdout  # setarch -R (ADDR_NO_RANDOMIZE) still works
    assert "seccomp" in r.mechanisms


@pytest.mark.skipif(not ROOT, reason="the tree is handed to the sandbox's uid only when TTTR runs as root")
def test_a_hard_link_or_symlink_to_a_host_file_is_never_given_away(tmp_path, tree):
    host = tmp_path / "host-secret"
    host.write_text("secret")
    os.chmod(host, 0o600)
    os.link(host, tree / "hard")
    os.symlink(host, tree / "soft")
    (tree / "sub").mkdir()
    (tree / "sub" / "mine").write_text("root wrote this\n")  # as a snapshot restore would
    with Executor(tree) as ex:
        r = ex.run("cat hard soft; echo pwned > hard; echo pwned > soft; echo more >> sub/mine && echo APPENDED", CLOCK)
    assert "secret" not in r.stdout and "APPENDED" in r.stdout
    assert host.read_text() == "secret"
    st = host.stat()
    assert (st.st_uid, st.st_gid) == (0, 0)
    assert (tree / "sub" / "mine").read_text() == "root wrote this\nmore\n"


def test_a_file_root_writes_between_commands_is_writable_by_the_next(tree):
    with Executor(tree) as ex:
        assert ex.run("mkdir -p d && echo one > d/f", CLOCK).exit_code == 0
        (tree / "d" / "g").write_text("from the host\n")
        os.chmod(tree / "d" / "g", 0o600)
        r = ex.run("echo two >> d/f && echo three >> d/g && cat d/g", CLOCK)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "from the host\nthree\n"


# -- limits ------------------------------------------------------------------------------

def test_the_tree_quota_stops_a_command_and_is_reported(tree):
    with Executor(tree, limits=Limits(tree_mb=4, timeout_s=60)) as ex:
        # small files, one at a time: no single file meets RLIMIT_FSIZE, the watcher stops it
        r = ex.run("for i in $(seq 400); do head -c 100000 /dev/zero > f$i; sleep 0.01; done; echo FINISHED", CLOCK)
        assert r.limit_hit == "tree-quota" and r.exit_code != 0 and "FINISHED" not in r.stdout
        assert "[tttr: the tree went past its 4 MB quota" in r.stderr
        assert r.to_json()["limit_hit"] == "tree-quota"
        # a command that ends before the watcher looks is reported after it
        r = ex.run("rm -f f*; head -c 3000000 /dev/zero > a; head -c 3000000 /dev/zero > b", CLOCK)
        assert r.limit_hit == "tree-quota" and r.exit_code != 0
        # no file larger than the quota can be written at all
        r = ex.run("rm -f a b; head -c 5000000 /dev/zero > big", CLOCK)
        assert r.limit_hit == "file-size" and (tree / "big").stat().st_size <= 4 << 20
        assert ex.run("rm -f big; echo fine", CLOCK).limit_hit is None


def test_tmp_and_dev_shm_have_a_size_and_a_full_one_is_reported(tree):
    with Executor(tree, limits=Limits(tmp_mb=2)) as ex:
        for where in ("/tmp", "/dev/shm", "/var/tmp"):
            r = ex.run(f"head -c 3000000 /dev/zero > {where}/x; echo rc=$?; stat -c %s {where}/x", CLOCK)
            assert "rc=1" in r.stdout and int(r.stdout.split()[-1]) <= 2 << 20, (where, r.stdout, r.stderr)
            assert r.limit_hit == "tmp-full" and "[tttr: /tmp or /dev/shm is full" in r.stderr
        assert "tmp-size" in r.mechanisms
        # ENOSPC from elsewhere (a refused user namespace) is no full /tmp
        r = ex.run("unshare -U true; echo 'No space left on device' >&2; head -c 1000000 /dev/zero > /tmp/y", CLOCK)
        assert r.limit_hit is None, r.stderr


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), -1.0, 0, 3601])
def test_the_timeout_is_bounded(bad):
    with pytest.raises(SandboxError) as info:
        Limits(timeout_s=bad)
    assert "timeout_s" in str(info.value) and info.value.exit_code == 2


@pytest.mark.parametrize("value", ["inf", "nan", "-5", "1e9"])
def test_cli_refuses_an_unbounded_timeout_in_one_line(value):
    out = subprocess.run([sys.executable, "-m", "tttr.app", "sandbox", "exec", "--timeout", value, "--", "true"],
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "timeout" in out.stderr


def test_cli_exits_with_the_commands_status(tmp_path):
    def status(*args: str) -> int:
        return subprocess.run([sys.executable, "-m", "tttr.app", "sandbox", "exec", "--tree", str(tmp_path), *args],
                              cwd=REPO, capture_output=True, text=True).returncode

    assert status("--", "true") == 0
    assert status("--", "exit 7") == 7
    assert status("--json", "--", "false") == 1
    assert status("--timeout", "0.5", "--", "sleep 5") == 124


# -- leftovers -------------------------------------------------------------------------

@pytest.mark.skipif(not probe().pids_cgroup, reason="no writable pids cgroup here")
def test_a_killed_recorders_cgroup_is_removed_by_the_next(tmp_path):
    root = Path(probe().pids_cgroup)
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that no longer exists (reaped)
    stale = root / f"tttr-{dead.pid}-123"
    stale.mkdir()
    alive = root / f"tttr-{os.getpid()}-456"  # our own pid: alive, kept
    alive.mkdir()
    try:
        cg = ExecutorCgroup(root, 64)
        cg.close()
        assert not stale.exists()
        assert alive.exists()
    finally:
        for p in (stale, alive):
            if p.exists():
                p.rmdir()


def test_a_recorder_killed_with_sigkill_leaves_no_cgroup_after_the_next_starts(tmp_path):
    if not probe().pids_cgroup:
        pytest.skip("no writable pids cgroup here")
    root = Path(probe().pids_cgroup)
    code = ("import sys; from datetime import datetime; from tttr.recorders.sandbox import Executor; "
            f"ex = Executor({str(tmp_path)!r}); ex.run('true', datetime(2026, 3, 2)); "
            "print(ex._cgroup.path, flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    path = Path(child.stdout.readline().strip())
    assert path.parent == root and path.exists()
    child.kill()
    child.wait()
    for _ in range(100):  # its spawner leaves the cgroup once its socket closes
        if not (path / "cgroup.procs").exists() or not (path / "cgroup.procs").read_text().split():
            break
        time.sleep(0.05)
    with Executor(tmp_path) as ex:
        ex.run("true", CLOCK)
    assert not path.exists()


# -- clock and randomness --------------------------------------------------------------

CLOCK_ESCAPES = [
    "date +%F",
    "env -u LD_PRELOAD date +%F",
    "LD_PRELOAD= date +%F",
    "FAKETIME=+1y date +%F",
    "FAKETIME='@2000-01-01 00:00:00' date +%F",
    "FAKETIME_SKIP_CMDS=date date +%F",
    "FAKETIME_ONLY_CMDS=nothing date +%F",
    "env -i /bin/date +%F",
    "printf '%(%F)T\\n' -1",
    "FAKETIME=+1y bash -c 'printf \"%(%F)T\\n\" -1'",
    "env -u LD_PRELOAD FAKETIME=-5y python3 -c 'import datetime; print(datetime.date.today())'",
    "python3 -c 'import os, subprocess; os.environ.pop(\"LD_PRELOAD\"); os.environ[\"FAKETIME\"] = \"+9y\"; "
    "subprocess.run([\"date\", \"+%F\"])'",
]


@pytest.mark.skipif(not (probe().faketime and probe().shim), reason=probe().line())
def test_the_virtual_clock_holds_whatever_the_environment_says(tree):
    with Executor(tree) as ex:
        r = ex.run("; ".join(CLOCK_ESCAPES), CLOCK)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.split() == [CLOCK.date().isoformat()] * len(CLOCK_ESCAPES), r.stdout
    for m in ("preload-all", "pinned-clock-vars"):
        assert m in r.mechanisms


RANDOMNESS = (
    "head -c 16 /dev/urandom | od -An -tx1; head -c 8 /dev/random | od -An -tx1; "
    "head -c 300000 /dev/urandom | md5sum; "
    "python3 -c 'import ctypes, errno, os, random, uuid; "
    "libc = ctypes.CDLL(None, use_errno=True); buf = ctypes.create_string_buffer(8); "
    "rc = libc.syscall(318, buf, 8, 0); "
    "print(rc, errno.errorcode.get(ctypes.get_errno()), random.random(), uuid.uuid4(), os.urandom(8).hex())'; "
    "env -u LD_PRELOAD python3 -c 'import os; print(os.urandom(8).hex())'"
)


def _draws(tmp_path, name: str, seed: int, step: int = 0) -> str:
    t = tmp_path / name
    t.mkdir()
    with Executor(t, seed=seed) as ex:
        r = ex.run(RANDOMNESS, CLOCK, step=step)
    assert r.exit_code == 0, r.stderr
    assert "seeded-urandom" in r.mechanisms
    return r.stdout


@pytest.mark.skipif(not probe().shim, reason=probe().line())
def test_urandom_and_a_raw_getrandom_are_seeded(tmp_path):
    a, b = _draws(tmp_path, "a", 7), _draws(tmp_path, "b", 7)
    c, d = _draws(tmp_path, "c", 8), _draws(tmp_path, "d", 7, step=1)
    assert a == b
    lines_a = a.splitlines()
    for other in (c, d):
        assert all(x != y for x, y in zip(lines_a[:3], other.splitlines()[:3])), (a, other)
        assert a.splitlines()[3].split()[2:] != other.splitlines()[3].split()[2:]
    if X86_64 and probe().seccomp:
        assert lines_a[3].split()[:2] == ["-1", "ENOSYS"]  # so programs fall back to /dev/urandom


# -- what other machines refuse ----------------------------------------------------------

def _probe_refusing(monkeypatch, refuse: set[str], euid: int):
    import tttr.recorders.probe as probe_mod

    def fake(prefix, bwrap, extra):
        if ("userns" in refuse and "--unshare-user" in extra) or \
           ("nested" in refuse and "--disable-userns" in extra) or \
           ("seccomp" in refuse and "--seccomp" in extra):
            return "bwrap: refused here (test)", ""
        return None, "self\nsys\n"

    monkeypatch.setattr(probe_mod, "_try_bwrap", fake)
    monkeypatch.setattr(probe_mod.os, "geteuid", lambda: euid)
    return probe_mod.probe.__wrapped__()


@pytest.mark.skipif(not probe().launcher, reason="no launcher here (no C compiler)")
def test_probe_says_what_the_machine_refuses(monkeypatch):
    sup = _probe_refusing(monkeypatch, {"nested", "seccomp"}, euid=0)
    assert sup.ok and "no-userns" not in sup.mechanisms() and "seccomp" not in sup.mechanisms()
    line = sup.line()
    assert "\n" not in line and "--disable-userns refused" in line and "refused the seccomp program" in line

    sup = _probe_refusing(monkeypatch, {"userns"}, euid=0)
    assert not sup.ok and "unprivileged uid" in sup.reason and "refuses it" in sup.reason
    assert sup.line().startswith("sandbox: refused (")

    sup = _probe_refusing(monkeypatch, {"userns"}, euid=1000)  # a user may still use a setuid bwrap
    assert sup.ok and not sup.userns and "user namespaces refused" in sup.line()
