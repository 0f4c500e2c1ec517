"""One command's private files, bound read-only into its sandbox at STEP_DIR: the pinned
clock and seed variables the shim answers getenv() from, the clock as /etc/faketimerc,
and the FIFO that serves the sandbox's /dev/urandom and /dev/random with the step's
seeded stream.

The executor keeps the FIFO's write end open while the command runs and tops it up from
the pump loop; readers therefore never see end-of-file, and what they read is the stream
from its start, in the order they read it. Created before the command, removed after."""

from __future__ import annotations

import os
import shutil

from tttr.recorders.output import Feed
from tttr.recorders.scratch import scratch_dir
from tttr.recorders.seedrandom import pinned_text, urandom_stream


def _scratch() -> str | None:
    """A memory file system for them where there is one (a few files a command: on a disk
    file system creating them costs milliseconds), else the default temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK) else None


SCRATCH = _scratch()
PREFIX = "tttr-step-"


class StepFiles:
    def __init__(self, env: dict[str, str], seed: int):
        self.path = str(scratch_dir(PREFIX, SCRATCH))  # and those of killed recorders go
        self.fd = -1
        try:
            os.chmod(self.path, 0o755)  # the sandbox's uid must reach them
            pinned = os.path.join(self.path, "pinned")
            with open(pinned, "w") as f:
                f.write(pinned_text(env))
            os.chmod(pinned, 0o444)
            # libfaketime's fallback when getenv("FAKETIME") finds nothing: bash defines its own
            # getenv(), which does not see the environment that early, so bash's builtins
            # ($EPOCHSECONDS, printf %(...)T) read the clock from /etc/faketimerc.
            rc = os.path.join(self.path, "faketimerc")
            with open(rc, "w") as f:
                f.write(env.get("FAKETIME", "+0") + "\n")
            os.chmod(rc, 0o444)
            fifo = os.path.join(self.path, "urandom")
            os.mkfifo(fifo, 0o600)
            self.fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            os.chmod(fifo, 0o444)  # the sandbox only reads it
            self.feed = Feed(self.fd, urandom_stream(seed))
            self.feed.fill()  # full before the command starts: its first reads never wait
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        shutil.rmtree(self.path, ignore_errors=True)
