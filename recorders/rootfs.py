"""The file system a sandboxed command sees: the host's programs read-only, a small
synthetic /etc, private /dev, /proc and /tmp, the task tree read-write at /work, and
a runtime directory (/run/tttr) holding the randomness shim and the bash start file."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from kernels.cbuild import cache_dir

SANDBOX_ROOT = "/work"          # where the task tree appears inside the sandbox
RUNTIME = "/run/tttr"           # runtime files inside the sandbox
UID = 1000                      # the agent's uid/gid inside the sandbox (user namespace)

# Host directories with programs and libraries; a symlink is recreated, a directory bound.
PROGRAM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
# /etc entries programs need to start and behave; nothing with secrets or host identity.
HOST_ETC = (
    "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates",
    "python3", "python3.11", "python3.12", "python3.13", "perl", "mime.types", "protocols",
    "services", "magic", "magic.mime", "inputrc", "os-release", "debian_version",
)
SYNTHETIC_ETC = {
    "passwd": (
        "root:x:0:0:root:/root:/bin/bash\n"
        f"agent:x:{UID}:{UID}:agent:{SANDBOX_ROOT}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "group": f"root:x:0:\nagent:x:{UID}:\nnogroup:x:65534:\n",
    "hostname": "sandbox\n",
    "hosts": "127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost\n",
    "nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\n",
}
# Sourced by every non-interactive bash (BASH_ENV): seeds $RANDOM from the step seed and
# the shell's pid, so nested bash scripts draw the same numbers on replay.
BASHENV = '[ -n "$TTTR_SEED" ] && RANDOM=$(( 16#${TTTR_SEED:0:8} ^ $$ ))\n'


def runtime_dir(shim: Path | None) -> Path:
    """A directory in the cache with the synthetic /etc files, bashenv and the shim."""
    key = hashlib.sha256(repr((SYNTHETIC_ETC, BASHENV, str(shim))).encode()).hexdigest()[:16]
    path = cache_dir() / f"runtime-{key}"
    if (path / "ready").exists():
        return path
    tmp = cache_dir() / f".runtime-{key}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "etc").mkdir(parents=True)
    for name, text in SYNTHETIC_ETC.items():
        (tmp / "etc" / name).write_text(text)
    (tmp / "bashenv").write_text(BASHENV)
    if shim is not None:
        shutil.copy2(shim, tmp / "seedrandom.so")
    (tmp / "ready").write_text("")
    try:
        os.rename(tmp, path)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def bwrap_fs_args(tree: Path, runtime: Path) -> list[str]:
    args: list[str] = []
    for d in PROGRAM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    for name in HOST_ETC:
        src = f"/etc/{name}"
        if os.path.lexists(src) and os.path.exists(src):
            args += ["--ro-bind", src, src]
    for name in SYNTHETIC_ETC:
        args += ["--ro-bind", str(runtime / "etc" / name), f"/etc/{name}"]
    args += [
        "--ro-bind", str(runtime), RUNTIME,
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
        "--dir", "/var/tmp",
        "--bind", str(tree), SANDBOX_ROOT,
    ]
    return args
