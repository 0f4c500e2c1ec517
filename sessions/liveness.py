"""Is the process that was recording a run still alive?

A run is written as `recording` with the identity of its writer process. A reader decides
"still recording" or "incomplete" from that identity alone, without writing to the file
and without trusting a PID on its own: PIDs are reused, so the identity also carries the
boot id and the process's start time (Linux `/proc`). WAL needs shared memory, hence one
host, so a writer from another boot is certainly gone.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "-"


def _start_ticks(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None if it is gone (or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may contain spaces
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def identity(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{_boot_id()}:{pid}:{_start_ticks(pid) or '-'}"


def alive(writer: str | None) -> bool:
    if not writer:
        return False
    try:
        boot, pid_text, ticks = writer.split(":")
        pid = int(pid_text)
    except ValueError:
        return False
    if boot != _boot_id():
        return False
    if boot == "-" or ticks == "-":  # no /proc here: fall back to the PID alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return _start_ticks(pid) == ticks
