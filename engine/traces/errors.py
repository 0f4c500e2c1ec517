"""The traces package's error: bad input (a file, a run, a collector), one line, exit 2."""

from tttr.sessions.errors import TTTRError


class TraceError(TTTRError):
    """A trace that cannot be read or written, or a collector that does not take it."""
