"""Shell state carried from one step's command to the next: the working directory and
the exported variables. Each command runs in a fresh bash; a prelude restores the state
before it and an exit trap reports it after, on a private file descriptor."""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass, field

from tttr.recorders.errors import SandboxError
from tttr.recorders.rootfs import SANDBOX_ROOT

PRIVATE_FD = 99        # the prelude moves the dump channel out of the agent's way
# Variables the sandbox sets for every command; never carried as the agent's own exports.
RUNTIME_NAMES = frozenset({
    "PWD", "OLDPWD", "SHLVL", "_", "TTTR_SEED", "BASH_ENV", "LD_PRELOAD", "FAKETIME",
    "FAKETIME_DONT_FAKE_MONOTONIC", "DONT_FAKE_MONOTONIC", "SOURCE_DATE_EPOCH", "FAKETIME_SHARED",
    "FAKETIME_DISABLE_SHM",
})


@dataclass(frozen=True, slots=True)
class ShellState:
    cwd: str = SANDBOX_ROOT
    exports: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.cwd, str) or not self.cwd.startswith("/"):
            raise SandboxError(f"bad shell state cwd {self.cwd!r}: give an absolute path inside the sandbox")
        for name, value in self.exports.items():
            if not name.isidentifier() or not isinstance(value, str) or "\0" in value:
                raise SandboxError(f"bad exported variable {name!r}={value!r}: names are identifiers, values strings")

    def to_json(self) -> dict:
        return {"cwd": self.cwd, "exports": dict(sorted(self.exports.items()))}

    @classmethod
    def from_json(cls, value: dict) -> "ShellState":
        return cls(cwd=value.get("cwd", SANDBOX_ROOT), exports=dict(value.get("exports", {})))


# In the state dump after the variables: the sandbox's /tmp or /dev/shm had no room left
# when the command ended (a pair whose name is no identifier, so never an export).
TMP_FULL_MARK = b"tttr:tmp-full"


def prelude(state: ShellState, ulimit_line: str, root: str = SANDBOX_ROOT, state_fd: int = 3,
            probe_tmp: bool = False) -> str:
    """The bash program that restores `state`, runs the command ($1) and reports state.
    With `probe_tmp` (only in a sandbox, whose /tmp is its own), the exit trap also tries
    to write one byte to /tmp and /dev/shm with builtins and reports TMP_FULL_MARK when
    either has no room left."""
    full = (
        # noclobber: O_EXCL, so a symlink the command left there is never written through
        "__tttr_full=; set -C; for __tttr_d in /tmp /dev/shm; do { printf x > $__tttr_d/.tttr-room.$$; } "
        "2>/dev/null || __tttr_full=1; done; "
        if probe_tmp else ""
    )
    mark = f"[ -n \"$__tttr_full\" ] && printf '{TMP_FULL_MARK.decode()}\\0\\0'; " if probe_tmp else ""
    cwd = state.cwd
    if root != SANDBOX_ROOT and (cwd == SANDBOX_ROOT or cwd.startswith(SANDBOX_ROOT + "/")):
        cwd = root + cwd[len(SANDBOX_ROOT):]  # unsafe mode: the tree is not mounted at /work
    # One line: bash numbers the lines of a `-c` program, so the agent's command, eval'd on
    # line 1, gets the same "bash: line N:" messages as under a plain `bash -c`.
    return (
        "__tttr_save() { __tttr_rc=$?; trap - EXIT; " + full +
        "{ printf 'cwd\\0%s\\0' \"$PWD\"; "
        "for __tttr_n in $(compgen -e); do printf '%s\\0%s\\0' \"$__tttr_n\" \"${!__tttr_n}\"; done; "
        + mark +
        f"}} >&{PRIVATE_FD} 2>/dev/null; exit $__tttr_rc; }}; "
        f"exec {PRIVATE_FD}>&{state_fd} {state_fd}>&-; "
        + (f"{ulimit_line}; " if ulimit_line else "")
        + f"cd -- {shlex.quote(cwd)} 2>/dev/null || cd -- {shlex.quote(root)}; "
        "trap __tttr_save EXIT; __tttr_c=$1; set --; eval \"$__tttr_c\"\n"
    )


def parse_state(dump: bytes, before: ShellState, base_env: dict[str, str],
                root: str = SANDBOX_ROOT) -> ShellState:
    """The state after a command, from the exit trap's dump; `before` when there is none
    (the shell was replaced by exec, or killed)."""
    parts = dump.split(b"\0")
    if len(parts) < 3 or parts[0] != b"cwd":
        return before
    cwd = parts[1].decode("utf-8", "surrogateescape")
    if root != SANDBOX_ROOT:
        if cwd == root or cwd.startswith(root.rstrip("/") + "/"):
            cwd = SANDBOX_ROOT + cwd[len(root.rstrip("/")):]
    cwd = posixpath.normpath(cwd) if cwd.startswith("/") else before.cwd
    exports = {}
    pairs = parts[2:]
    for i in range(0, len(pairs) - 1, 2):
        name = pairs[i].decode("utf-8", "replace")
        value = pairs[i + 1].decode("utf-8", "replace")
        if name in RUNTIME_NAMES or not name.isidentifier() or base_env.get(name) == value:
            continue
        exports[name] = value
    return ShellState(cwd=cwd, exports=dict(sorted(exports.items())))
