"""The seeded-randomness shim: a preloaded library that answers getrandom, getentropy
and arc4random from a stream seeded by (run seed, step, pid), and pins the variables
that steer the virtual clock. Its second half, recorders/logicalclock.py, answers the
clock itself where the logical clock is on, and otherwise passes monotonic
clock_nanosleep() calls to the kernel past libfaketime, which answers them with EINVAL
when the monotonic clock is real.

It is shipped as C source (recorders/seedrandom.c, which includes logicalclock.h) and
compiled with the system C compiler on first use into the cache directory. Seeding by pid
as well keeps two processes of one command from drawing the same bytes, and stays
deterministic because PIDs repeat in a fresh PID namespace when the same processes start.

Inside the sandbox the shim and libfaketime are listed in /etc/ld.so.preload, so they are
loaded into every dynamically linked process whatever its environment (unsetting
LD_PRELOAD changes nothing). The shim also answers getenv() for libfaketime's variables
(FAKE*, DONT_FAKE*, NO_FAKE*), TTTR_SEED and TTTR_LOGICAL_CLOCK from a read-only file the executor writes for
each command (PINNED_FILE): setting FAKETIME or FAKETIME_SKIP_CMDS in the sandbox changes
nothing either. The shim comes first in the preload order, so libfaketime's own getenv()
calls reach it. Outside the sandbox (no such file) it reads the environment as libc does.

The sandbox's /dev/urandom and /dev/random are a FIFO the executor fills with
`urandom_stream(step seed)`, and a raw getrandom system call answers ENOSYS (seccomp), so
programs that bypass libc's getrandom() fall back to that seeded stream.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tttr.recorders.logicalclock import CLOCK_FILE, MONOTONIC_BASE_S, VARIABLE as LOGICAL_CLOCK_VARIABLE
from tttr.sessions.cache import build_shared, c_source

STEP_DIR = "/run/tttr-step"             # per-command files, inside the sandbox (read-only)
PINNED_FILE = f"{STEP_DIR}/pinned"
URANDOM_BLOCK = 1 << 16

SOURCE = c_source(Path(__file__).with_name("seedrandom.c"))  # with logicalclock.h


def build_shim() -> tuple[Path | None, str | None]:
    """(path of the compiled shim, None) or (None, why it could not be built)."""
    defines = [f'-DPINNED_FILE="{PINNED_FILE}"', f"-DMONOTONIC_BASE_S={MONOTONIC_BASE_S}",
               f'-DCLOCK_SHARE_FILE="{CLOCK_FILE}"']
    return build_shared("seedrandom", SOURCE, ["-shared", "-fPIC", "-O2", "-pthread", *defines], "the randomness shim")


def pinned_text(env: dict[str, str]) -> str:
    """The PINNED_FILE for one command: the clock's and the seed's variables, one a line."""
    return "".join(f"{k}={v}\n" for k, v in env.items() if is_pinned_name(k))


def is_pinned_name(name: str) -> bool:
    """The names the shim answers from PINNED_FILE (its tttr_is_pinned())."""
    return name.startswith(("FAKE", "DONT_FAKE", "NO_FAKE")) or name in ("TTTR_SEED", LOGICAL_CLOCK_VARIABLE)


def urandom_stream(seed: int):
    """Blocks of the seeded stream the sandbox's /dev/urandom serves: SHAKE-256 of
    (step seed, block number), 64 KiB each."""
    key = b"tttr-urandom:" + seed.to_bytes(8, "big")
    counter = 0

    def chunk() -> bytes:
        nonlocal counter
        block = hashlib.shake_256(key + counter.to_bytes(8, "big")).digest(URANDOM_BLOCK)
        counter += 1
        return block

    return chunk


def step_seed(seed: int, step: int) -> int:
    """64-bit seed for one step's command, a function of (run seed, step) only."""
    h = hashlib.sha256(f"tttr-trace:{seed}:{step}".encode()).digest()
    return int.from_bytes(h[:8], "big")
