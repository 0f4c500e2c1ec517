"""The virtual clock value a step's command sees: parsing and the libfaketime form."""

from __future__ import annotations

from datetime import datetime, timezone

from tttr.recorders.errors import SandboxError


def parse_clock(text: str) -> datetime:
    """ISO 8601 -> naive UTC datetime (whole seconds). Naive input is taken as UTC."""
    try:
        value = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise SandboxError(
            f"bad clock {text!r}: give an ISO date-time such as 2026-11-29T10:00:00"
        ) from None
    return normalize_clock(value)


def normalize_clock(value: datetime) -> datetime:
    """Aware -> UTC, then naive; sub-second part dropped (libfaketime's @ form takes seconds)."""
    if not isinstance(value, datetime):
        raise SandboxError(f"bad clock {value!r}: pass a datetime")
    if value.tzinfo is not None:
        value = value.astimezone(timezone.utc).replace(tzinfo=None)
    if not 1971 <= value.year <= 2999:
        raise SandboxError(f"bad clock {value.isoformat()}: the year must be between 1971 and 2999")
    return value.replace(microsecond=0)


def clock_epoch(value: datetime) -> int:
    return int(normalize_clock(value).replace(tzinfo=timezone.utc).timestamp())


def faketime_spec(value: datetime) -> str:
    """libfaketime's "start at" form: the clock starts at this value in each process and runs."""
    return "@" + normalize_clock(value).strftime("%Y-%m-%d %H:%M:%S")


def iso(value: datetime) -> str:
    return normalize_clock(value).isoformat()
