"""The engine's error for mistakes a user can make: a path that is not a model, an
unsupported architecture, a prompt longer than the context, a bad sampling value."""

from __future__ import annotations

from tttr.sessions.errors import TTTRError


class EngineError(TTTRError, ValueError):
    """One line: what is wrong (with the offending value) and what to do instead."""
