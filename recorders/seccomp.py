"""The sandbox's seccomp program: system calls an agent's shell never needs are refused.

Built with libseccomp (through the `pyseccomp` ctypes bindings) as a default-allow filter,
like Docker's and Flatpak's defaults turned around: mounting, tracing other processes,
kernel modules and kexec, keyrings, new namespaces of any kind, BPF and perf, reboot and
swap, setting the clocks, accounting and quotas, userfaultfd, file handles, io_uring,
faking terminal input, and unusual personalities fail with EPERM. Sockets of any address
family but Unix, IPv4, IPv6 and netlink fail with EAFNOSUPPORT, as on a kernel without
them: the network namespace covers those four, not AF_VSOCK (the host's hypervisor
sockets), AF_PACKET, Bluetooth, AF_ALG and the rest. `clone3` answers ENOSYS
(its flags cannot be inspected, so libc falls back to `clone`, whose flags are checked),
and a raw `getrandom` answers ENOSYS so that programs fall back to the sandbox's seeded
/dev/urandom (libc's getrandom() is answered by the randomness shim before any syscall).

The program is exported as BPF into the cache once per process and handed to bwrap's
`--seccomp` by the launcher. Calls from other architectures (i386, x32) are killed.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
from pathlib import Path

from tttr.sessions.cache import cache_dir

DENIED = (
    # file systems and mounts
    "mount", "umount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "quotactl", "quotactl_fd", "swapon", "swapoff",
    "open_by_handle_at", "name_to_handle_at", "fanotify_init", "lookup_dcookie",
    # other processes and the kernel
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "create_module", "get_kernel_syms", "query_module", "reboot", "syslog", "acct",
    "iopl", "ioperm", "vhangup", "uselib", "nfsservctl", "_sysctl", "sysfs", "ustat",
    "add_key", "request_key", "keyctl",
    "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    # namespaces and identity the sandbox pins
    "unshare", "setns", "sethostname", "setdomainname",
    # clocks (the virtual clock is the only one)
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime",
)
CLONE_NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000,
                         0x40000000, 0x00000080)  # NEWNS CGROUP UTS IPC USER PID NET TIME
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
# personality(2): the bits programs use (the 32-bit domain 0x8, UNAME26 0x20000, setarch -R's
# ADDR_NO_RANDOMIZE 0x40000) and the query 0xffffffff pass; any other bit (READ_IMPLIES_EXEC,
# MMAP_PAGE_ZERO, ADDR_LIMIT_32BIT, …) fails. libseccomp takes one comparison per argument and
# rule, so the set is spelled as one rule per refused bit.
PERSONALITY_BITS = (3, 17, 18)
PERSONALITY_QUERY = 0xFFFFFFFF
ENOSYS_CALLS = ("clone3", "getrandom")
# socket(2) and socketpair(2): the address families a shell needs (AF_UNIX, AF_INET,
# AF_INET6, AF_NETLINK); the rest fail as if the kernel had none of them.
SOCKET_FAMILIES = (1, 2, 10, 16)


def _build():
    import pyseccomp as sc

    f = sc.SyscallFilter(defaction=sc.ALLOW)
    try:  # a binary search over the syscall numbers instead of a linear walk: every call pays it
        f.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    except Exception:
        pass
    for name in DENIED:
        try:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
        except Exception:  # a name this libseccomp or architecture does not know
            continue
    for name in ENOSYS_CALLS:
        f.add_rule(sc.ERRNO(errno.ENOSYS), name)
    for flag in CLONE_NAMESPACE_FLAGS:
        f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for request in (TIOCSTI, TIOCLINUX):
        f.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    for call in ("socket", "socketpair"):
        for family in _refused_families():
            f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), call, family)
    top = 1 << 31
    f.add_rule(sc.ERRNO(errno.EPERM), "personality", sc.Arg(0, sc.GT, PERSONALITY_QUERY))
    for bit in range(31):
        # bit 31 clear and another bit set: refused unless it is one programs use
        if bit not in PERSONALITY_BITS:
            f.add_rule(sc.ERRNO(errno.EPERM), "personality", sc.Arg(0, sc.MASKED_EQ, top | 1 << bit, 1 << bit))
        # bit 31 set but not every bit: not the query
        f.add_rule(sc.ERRNO(errno.EPERM), "personality", sc.Arg(0, sc.MASKED_EQ, top | 1 << bit, top))
    return f


def _refused_families():
    """One comparison of socket's first argument per rule (libseccomp takes one per argument):
    each number below the largest allowed family that is not allowed, then every number above."""
    import pyseccomp as sc

    top = max(SOCKET_FAMILIES)
    refused = [sc.Arg(0, sc.EQ, n) for n in range(top) if n not in SOCKET_FAMILIES]
    return refused + [sc.Arg(0, sc.GT, top)]


@functools.lru_cache(maxsize=1)
def seccomp_program() -> tuple[str | None, str | None]:
    """(path of the BPF program in the cache, None) or (None, why there is none, one line)."""
    try:
        f = _build()
    except ImportError:
        return None, "no seccomp filter: the pyseccomp package is not installed (pip install pyseccomp)"
    except Exception as exc:  # libseccomp missing (libseccomp2) or refusing a rule
        return None, f"no seccomp filter: libseccomp failed ({exc}); install libseccomp2 and pyseccomp"
    tmp = cache_dir() / f".seccomp-{os.getpid()}.bpf"
    try:
        with open(tmp, "wb") as out:
            f.export_bpf(out)
        data = tmp.read_bytes()
        path = cache_dir() / f"seccomp-{hashlib.sha256(data).hexdigest()[:16]}.bpf"
        os.replace(tmp, path)
    except OSError as exc:
        return None, f"no seccomp filter: cannot write it to the cache ({exc})"
    return str(path), None


def program_path() -> Path | None:
    path, _ = seccomp_program()
    return Path(path) if path else None
