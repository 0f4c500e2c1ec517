"""Errors of the trace layer that a user can cause (bad path, bad clock, missing sandbox)."""

from __future__ import annotations

from tttr.sessions.errors import TTTRError


class RecorderError(TTTRError):
    """A mistake the user can fix; the CLI prints it as one line and exits 2."""


class SandboxError(RecorderError):
    """The sandbox cannot run a command as asked (refused, bad tree, bad clock)."""


class SnapshotError(RecorderError):
    """A snapshot cannot be taken or restored (missing blob, bad manifest, bad path)."""


class TaskError(RecorderError):
    """A task is unknown or malformed."""
