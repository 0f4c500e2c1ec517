"""Escape probes against the real sandbox, run as whoever runs the tests (root in CI): a
command must not change anything of the host outside its tree, whoever runs TTTR."""

from __future__ import annotations

import os
import platform

import pytest

from recorders.probe import probe
from recorders.sandbox import Executor
from tests.sandbox_helpers import CLOCK, needs_sandbox

pytestmark = needs_sandbox
ROOT = os.geteuid() == 0
X86_64 = platform.machine() == "x86_64"

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
