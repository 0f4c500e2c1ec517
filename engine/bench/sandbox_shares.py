"""What each of the sandbox's mechanisms costs per command: the same `true` started with the
full sandbox and with one mechanism left out at a time, interleaved, medians. A share is
median(full) - median(without it): what that mechanism adds to every command. The shares do
not sum to the whole (bwrap's namespaces, the root's mounts and bash's own start are in every
variant), and on a loaded machine a share within ~1 ms of zero is noise.

Every variant is started the same way (a plain child of this process, not the executor's
spawner), so the figures compare with each other, not with `overhead_ms`."""

from __future__ import annotations

import copy
import os
import statistics
import subprocess
import time
from dataclasses import replace

from tttr.recorders.shell import ShellState

# name -> what is left out; "full" leaves nothing out
VARIANTS = ("full", "launcher", "seccomp", "preload", "proc masks", "step files", "state prelude")


def _without(ex, name: str):
    """A copy of executor `ex` whose commands lack mechanism `name` (for measuring only)."""
    v = copy.copy(ex)
    v._fs_args = None
    sup = ex.support
    if name == "launcher":  # bwrap started directly (as root it maps the agent to host root)
        v.support, v._host_uid = replace(sup, launcher=None), None
    elif name == "seccomp":
        v.support = replace(sup, seccomp=None)
    elif name == "preload":
        v.support, v._shim = replace(sup, faketime=None), None
    elif name == "proc masks":
        v.support = replace(sup, proc_entries=frozenset())
    return v


def variant_argv(ex, name: str, clock, step_dir: str, state_fd: int) -> list[str]:
    v = _without(ex, name)
    argv = v._prepare("true", clock, 0, ShellState(), state_fd=state_fd,
                      step_dir=None if name == "step files" else step_dir).argv
    if name == "state prelude":  # the shell alone, without the script that saves cwd and exports
        shell = len(argv) - 1 - argv[::-1].index("/bin/bash")
        argv = argv[:shell] + ["/bin/bash", "-c", "true"]
    return argv


def overhead_shares(ex, clock, repeats: int) -> dict[str, float]:
    """{mechanism: ms it adds to a command}, plus "full": the median of the whole command. A
    variant that does not run here has None; nothing when the full command fails."""
    from tttr.recorders.seedrandom import step_seed
    from tttr.recorders.stepfiles import StepFiles

    files = StepFiles(ex.base_env(clock, 0), step_seed(ex.seed, 0))
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        argvs = {name: variant_argv(ex, name, clock, files.path, sink) for name in VARIANTS}
        env = ex._prepare("true", clock, 0, ShellState()).popen_env
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        failed: set[str] = set()  # a variant this machine refuses (bwrap started directly, say)
        for _ in range(repeats):
            for name, argv in argvs.items():
                if name in failed:
                    continue
                t0 = time.perf_counter()
                done = subprocess.run(argv, env=env, pass_fds=(sink,), stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                times[name].append((time.perf_counter() - t0) * 1000)
                if done.returncode != 0:
                    failed.add(name)
    finally:
        os.close(sink)
        files.close()
    if "full" in failed:
        return {}
    full = statistics.median(times["full"])
    return {"full": round(full, 2)} | {
        name: None if name in failed else round(full - statistics.median(times[name]), 2)
        for name in VARIANTS if name != "full"}
