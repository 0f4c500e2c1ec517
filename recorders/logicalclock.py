"""The logical clock: the part of the preloaded shim (recorders/seedrandom.py) that makes a
program's clock a function of what the program did, never of how long it took. Its C is
recorders/logicalclock.h, which seedrandom.c includes; the shim's build defines
MONOTONIC_BASE_S from here.

On only where the pinned variable TTTR_LOGICAL_CLOCK="<start epoch s> <step ns>" is set
(`Executor(logical_clock=True)`, which recorded programs, their replays and forks use).
Each process keeps logical time, as Hermit does: the time it slept or waited out, plus
STEP_NS per read of the clock it reads, counted apart for the realtime and the monotonic
clocks (so a realtime value never depends on how often a socket's timeout loop read the
monotonic clock, which depends on when data arrived):

- a read of a realtime clock (clock_gettime's REALTIME, REALTIME_COARSE, TAI,
  gettimeofday, time, ftime, timespec_get) returns start + waited + realtime reads x STEP_NS;
  of a monotonic one (MONOTONIC, _COARSE, _RAW, BOOTTIME), MONOTONIC_BASE_S + waited +
  monotonic reads x STEP_NS; CPU-time clocks are real. A step of 1 µs keeps `datetime.now()` to the second at the start time unless
  the program slept.
- a sleep (nanosleep, clock_nanosleep relative or to an absolute deadline on either clock,
  usleep, sleep) really waits the requested (remaining) time, then adds it: the requested
  amount, not the measured one.
- a wait with a relative timeout (select, pselect, poll, ppoll, epoll_wait, epoll_pwait,
  epoll_pwait2, sigtimedwait) adds its timeout when it timed out; one with an absolute
  deadline (pthread_cond_timedwait and _clockwait, sem_timedwait and _clockwait,
  pthread_mutex_timedlock and _clocklock, pthread_rwlock_timed*lock and _clock*lock)
  waits the logical time left until the deadline on the real monotonic clock, and adds it
  when it timed out. The exception is the GIL's 5 ms switch wait in CPython's core, which
  times out as often as threads contend, so it adds nothing (its timeouts depend on load).
  An interrupted wait adds the time it really waited (signals come in real time anyway).
- a process started by exec continues from its parent's logical time: the exec and
  posix_spawn wrappers (system and popen too) pass it in TTTR_LOGICAL_AT, which the child
  reads and removes from its environment before main; fork keeps the counter as it keeps
  memory.

A recorded program's realtime reads are also shared with the host, through a small file
(`ClockShare`) bound read-write into the sandbox at CLOCK_FILE (elsewhere, named by
TTTR_CLOCK_SHARE): the shim writes the last realtime value any process read, which the
in-process server records with each model call (`STEP:clock`), and adds the offset the host
writes there to every realtime read (a fork at a clock site; monotonic clocks, and so sleeps
and timeouts, are not moved). A realtime deadline is moved with it.

The shim's own real time comes from raw system calls, its real waits from libc itself
(looked up in libc.so.6, past libfaketime, which would take a real deadline for a faked one).
"""

from __future__ import annotations

import os
import struct
from datetime import datetime, timedelta
from pathlib import Path

from tttr.recorders.clock import clock_epoch

VARIABLE = "TTTR_LOGICAL_CLOCK"
STEP_NS = 1000                 # what one clock read advances the clock by
MONOTONIC_BASE_S = 1000        # the monotonic clock's value at the command's start
CLOCK_DIR = "/run/tttr-clock"  # the shared clock file's folder, inside the sandbox (read-write)
CLOCK_FILE = f"{CLOCK_DIR}/clock"
SHARE_VARIABLE = "TTTR_CLOCK_SHARE"  # its path where there is no sandbox
_WORDS = struct.Struct("<qq")  # the offset (ns), the last realtime read (µs since the epoch); 0: none yet
_EPOCH = datetime(1970, 1, 1)


def logical_clock_value(clock: datetime) -> str:
    """TTTR_LOGICAL_CLOCK for a command whose clock starts at `clock`."""
    return f"{clock_epoch(clock)} {STEP_NS}"


class ClockShare:
    """The host's side of the clock file a program's shim maps (see the module's text). The
    folder is the host's (the sandbox may write the file, never add one beside it); the
    file is read through the descriptor opened when it was made, a bounded read, and what
    it holds is the program's to write: a value out of the calendar reads as no value."""

    def __init__(self, folder: Path):
        folder = Path(folder)
        folder.mkdir(mode=0o755)
        self.path = folder / "clock"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        os.fchmod(self._fd, 0o666)  # the sandbox's uid writes it (the umask took that bit)
        os.pwrite(self._fd, _WORDS.pack(0, 0), 0)
        self.folder = folder
        self._last: int | None = None

    def bind(self) -> tuple[str, str, str]:
        """(host folder, its path inside, "rw") for the executor's binds."""
        return str(self.folder), CLOCK_DIR, "rw"

    def env(self) -> dict[str, str]:
        """The program's environment where it runs unsandboxed (the file at its host path)."""
        return {SHARE_VARIABLE: str(self.path)}

    def _read(self) -> tuple[int, int]:
        data = os.pread(self._fd, _WORDS.size, 0)
        return _WORDS.unpack(data) if len(data) == _WORDS.size else (0, 0)

    @property
    def offset(self) -> timedelta:
        return timedelta(microseconds=self._read()[0] // 1000)

    def set_offset(self, shift: timedelta) -> None:
        """Move every realtime read the program makes from now on by `shift` (from the recorded clock)."""
        ns = (shift.days * 86400 + shift.seconds) * 10**9 + shift.microseconds * 1000
        os.pwrite(self._fd, struct.pack("<q", ns), 0)

    def last_read(self) -> datetime | None:
        """The last realtime value the program read (naive UTC), None before its first read."""
        us = self._read()[1]
        if us <= 0:
            return None
        try:
            return _EPOCH + timedelta(microseconds=us)
        except OverflowError:
            return None

    def current(self) -> dict | None:
        """A model call's `clock` event: the program's last realtime read as the call was
        asked, with the offset it was read under; None when it read none since the last
        call's event (`event`)."""
        t = self.last_read()
        if t is None or t == self._last:
            return None
        out = {"t": t.isoformat(), "source": "program"}
        offset = self._read()[0]
        if offset:
            out["offset_s"] = offset / 1e9
        return out

    def event(self) -> dict | None:
        """`current()`, taken: the next call's event holds only reads made after it."""
        out = self.current()
        if out is not None:
            self._last = datetime.fromisoformat(out["t"])
        return out

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
