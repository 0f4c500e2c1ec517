"""The logical clock: the part of the preloaded shim (recorders/seedrandom.py) that makes a
program's clock a function of what the program did, never of how long it took. Its C is
recorders/logicalclock.h, which seedrandom.c includes; the shim's build defines
MONOTONIC_BASE_S from here.

On only where the pinned variable TTTR_LOGICAL_CLOCK="<start epoch s> <step ns>" is set
(`Executor(logical_clock=True)`, which recorded programs, their replays and forks use).
Each process keeps one counter, logical ns, as Hermit does:

- every clock read adds STEP_NS and returns start + logical ns (the realtime clocks:
  clock_gettime's REALTIME, REALTIME_COARSE, TAI, gettimeofday, time, ftime, timespec_get)
  or MONOTONIC_BASE_S + logical ns (MONOTONIC, _COARSE, _RAW, BOOTTIME); CPU-time clocks
  are real. A step of 1 µs keeps `datetime.now()` to the second at the start time unless
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

The shim's own real time comes from raw system calls, its real waits from libc itself
(looked up in libc.so.6, past libfaketime, which would take a real deadline for a faked one).
"""

from __future__ import annotations

from datetime import datetime

from tttr.recorders.clock import clock_epoch

VARIABLE = "TTTR_LOGICAL_CLOCK"
STEP_NS = 1000                 # what one clock read advances the clock by
MONOTONIC_BASE_S = 1000        # the monotonic clock's value at the command's start


def logical_clock_value(clock: datetime) -> str:
    """TTTR_LOGICAL_CLOCK for a command whose clock starts at `clock`."""
    return f"{clock_epoch(clock)} {STEP_NS}"
