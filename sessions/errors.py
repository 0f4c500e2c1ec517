"""The errors a user can cause, for every package: one base class, `TTTRError`, defined
here in the lowest package so that the store, the recorders, the engine and the kernels
all derive from it and the command line catches one class.

A `TTTRError` prints as one line (what is wrong, with the offending value, and what to do
instead) and exits with its `exit_code`. Anything else is a bug and keeps its traceback."""


class TTTRError(Exception):
    """A mistake the user can fix; `tttr` prints it as one line and exits `exit_code`."""

    exit_code = 2


class StoreError(TTTRError):
    """A bad path, a foreign or damaged file, an unknown run."""
