"""The trace side of a run: the sandbox tree as the run now stands, the shell state carried
from one command to the next, and the executor that runs commands in that tree.

The tree is known by its digest. It is on disk only when a command must run live: then it
is restored from the recording's snapshot of that digest (or is the one the run set up),
and after the command it is snapshotted again so a later replay can restore it.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from tttr.engine.replay.events import EventLog
from tttr.engine.replay.source import OracleError
from tttr.recorders.clock import clock_epoch
from tttr.recorders.filetimes import clamp_times
from tttr.recorders.scratch import scratch_dir
from tttr.recorders.shell import ShellState
from tttr.recorders.snapshot import restore, snapshot, tree_digest
from tttr.recorders.treeio import NotRegularFile, remove_tree, write_beneath

UNRUNNABLE_EXIT = 126  # the shell's "cannot execute"
NUL_STDERR = "tttr: the command contains a NUL byte (\\x00), which no shell command line can hold; it was not run\n"


class World:
    def __init__(self, *, store, task, seed: int, executor_factory: Callable, log: EventLog,
                 manifests: dict[str, str] | None = None):
        self.store = store
        self.task = task
        self.seed = seed
        self._executor_factory = executor_factory  # (tree_dir, seed) -> Executor
        self._log = log  # where large outputs go, and whether anything is written at all
        self.tree: str | None = None  # digest of the sandbox tree as the run now stands
        self.shell = ShellState()
        self.commands_run = 0
        self._manifests: dict[str, str] = dict(manifests or {})
        self._workdir = scratch_dir("tttr-run-")  # a recorder killed with SIGKILL leaves it to the next
        self._tree_dir: Path | None = None  # materialised tree, if any
        self._tree_dir_digest: str | None = None
        self._executor = None
        self._executor_tree: Path | None = None
        self._answer_index: dict | None = None  # known_answer's, read at its first use

    # ------------------------------------------------------------------ the tree
    def _executor_for(self, tree_dir: Path):
        if self._executor is None or self._executor_tree != tree_dir:
            self._executor = self._executor_factory(tree_dir, self.seed)
            self._executor_tree = tree_dir
        return self._executor

    def _materialise(self) -> Path:
        """The sandbox tree on disk, at the state the run now stands in."""
        if self._tree_dir is not None and self._tree_dir_digest == self.tree:
            return self._tree_dir
        manifest = self._manifests.get(self.tree)
        if manifest is None:
            raise OracleError(f"no snapshot of tree {self.tree} in the recording: cannot restore it")
        dest = self._workdir / f"tree-{self._log.next_seq}"
        restore(manifest, self.store, dest)
        if self._tree_dir is not None:
            remove_tree(self._tree_dir)
        self._tree_dir, self._tree_dir_digest = dest, self.tree
        return dest

    def _snapshot(self, tree_dir: Path) -> tuple[str, str | None]:
        digest = tree_digest(tree_dir)
        manifest = self._manifests.get(digest)
        if manifest is None and self._log.write:
            manifest = snapshot(tree_dir, self.store)
            self._manifests[digest] = manifest
        self._tree_dir_digest = digest
        return digest, manifest

    # ------------------------------------------------------------------ what happens in it
    def set_up(self, clock: datetime) -> dict:
        """Run the task's setup in a fresh tree; the setup value to record."""
        tree_dir = self._workdir / "tree"
        tree_dir.mkdir()
        self.task.setup(tree_dir, self._executor_for(tree_dir), clock)
        self._tree_dir = tree_dir
        self.tree, manifest = self._snapshot(tree_dir)
        return {"task": self.task.name, "clock": clock.isoformat(), "tree": self.tree, "snapshot": manifest}

    def edit_file(self, path: str, text: str, clock: datetime) -> tuple[str, str | None]:
        """Set the text of the file at `path` (relative, "/"-separated) in the tree as it
        stands, through directory descriptors that never follow a link; the tree's new
        digest and manifest. A fork's `setup:file:PATH`. The times it leaves read `clock`
        (the setup's), as a command's do: the same edit gives the same tree every time."""
        tree_dir = self._materialise()
        started = time.time_ns()
        try:
            write_beneath(str(tree_dir), path, text.encode("utf-8", "surrogateescape"))
        except NotRegularFile:
            raise OracleError(f"setup:file:{path}: not a regular file in the start tree") from None
        except OSError as exc:
            raise OracleError(f"setup:file:{path}: cannot write it in the start tree ({exc.strerror})") from None
        clamp_times(str(tree_dir), started, time.time_ns(), clock_epoch(clock))
        self.tree, manifest = self._snapshot(tree_dir)
        return self.tree, manifest

    def start_with(self, name: str, value: str) -> dict[str, str]:
        """Export `name`=`value` before the first command (a fork's `setup:env:NAME`); the
        variables the run now starts with."""
        self.shell = ShellState(self.shell.cwd, {**self.shell.exports, name: value})
        return dict(self.shell.exports)

    def run(self, step: int, cmd: str, clock: datetime) -> dict:
        """Run `cmd` live in the tree as it stands; the tool value to record."""
        before, shell = self.tree, self.shell
        if "\0" in cmd:
            return self._unrunnable(cmd, NUL_STDERR)
        tree_dir = self._materialise()
        res = self._executor_for(tree_dir).run(cmd, clock=clock, step=step, state=shell)
        self.commands_run += 1
        after, manifest = self._snapshot(tree_dir) if self._log.write else (before, None)
        return {
            "cmd": cmd,
            "cwd": shell.cwd,
            "exports": dict(shell.exports),
            "env": res.env,
            "stdout": self._log.text_value(res.stdout),
            "stderr": self._log.text_value(res.stderr),
            "exit_code": res.exit_code,
            "duration_ms": round(res.duration_ms, 3),
            "stdout_size": res.stdout_size,
            "stderr_size": res.stderr_size,
            "truncated": res.truncated,
            "limit_hit": res.limit_hit,  # timeout, tree-quota, tmp-full, file-size, or None
            "tree_before": before,
            "tree_after": after,
            "snapshot": manifest if after != before else None,
            "cwd_after": res.state_after.cwd,
            "exports_after": dict(res.state_after.exports),
        }

    def known_answer(self, step: int, cmd: str, clock: datetime) -> dict | None:
        """The world as a function of its state: a tool value that some run of this task in
        the database recorded for this command in this state (tree, working directory,
        exports, and the environment it saw, which holds the clock and the step's seed), as
        that state's answer, marked `reused_from` (run, site); None when no run has asked.
        A live re-run of the same command in the same state can answer otherwise (a
        pipeline's stderr interleaves by scheduling), so a replay that needs a command its
        source never ran takes the answer the database already holds."""
        index = self._answers()
        if not index:
            return None
        shell = self.shell
        expected = {**self._executor_for(self._materialise()).base_env(clock, step), **shell.exports}
        found = index.get(_state_key(cmd, shell.cwd, shell.exports, self.tree, expected))
        if found is None:
            return None
        run_id, at, value = found
        if value.get("snapshot") and value.get("tree_after"):
            self._manifests.setdefault(value["tree_after"], value["snapshot"])
        return {**value, "reused_from": {"run": run_id, "site": at}}

    def _answers(self) -> dict:
        """(state key) -> (run, site, tool value) over the task's recorded runs, read once."""
        if self._answer_index is None:
            self._answer_index = {}
            runs = getattr(self.store, "runs", None)
            for run in (runs() if runs is not None else ()):
                if run.task != self.task.name or run.problem:
                    continue
                for e in self.store.events(run.id, kind="tool"):
                    v = e.value
                    if not isinstance(v, dict) or v.get("mutated") or not isinstance(v.get("env"), dict) \
                            or not isinstance(v.get("cmd"), str) or not isinstance(v.get("exports", {}), dict):
                        continue
                    env = {k: x for k, x in v["env"].items() if k != "LD_PRELOAD"}
                    key = _state_key(v["cmd"], v.get("cwd"), v.get("exports", {}), v.get("tree_before"), env)
                    self._answer_index.setdefault(key, (run.id, e.site, {k: x for k, x in v.items()
                                                                        if k not in ("off_record", "reused_from")}))
        return self._answer_index

    def _unrunnable(self, cmd: str, stderr: str) -> dict:
        """A command no shell can be given (the model wrote a NUL byte): a failed tool call,
        as a shell reports a command it cannot run, not the end of the run. Nothing ran,
        so the tree and the shell state stay as they were."""
        before, shell = self.tree, self.shell
        return {
            "cmd": cmd, "cwd": shell.cwd, "exports": dict(shell.exports), "env": {},
            "stdout": "", "stderr": stderr, "exit_code": UNRUNNABLE_EXIT, "duration_ms": 0.0,
            "stdout_size": 0, "stderr_size": len(stderr.encode()), "truncated": False,
            "tree_before": before, "tree_after": before, "snapshot": None,
            "cwd_after": shell.cwd, "exports_after": dict(shell.exports),
        }

    def advance(self, value: dict) -> None:
        """The run moves on to the tree and shell state after a tool value (live, recorded
        or mutated)."""
        self.tree = value.get("tree_after", self.tree)
        self.shell = ShellState(value.get("cwd_after", self.shell.cwd),
                                dict(value.get("exports_after", self.shell.exports)))

    def check(self, clock: datetime) -> dict:
        """Run the task's checker on the tree as it stands; the outcome to record."""
        tree_dir = self._materialise()
        passed, code, output = self.task.check(tree_dir, self._executor_for(tree_dir), clock)
        return {"passed": bool(passed), "checker_exit": int(code), "checker_output": output[-2000:],
                "tree": self.tree, "clock": clock.isoformat()}

    def close(self) -> None:
        remove_tree(self._workdir)


def _state_key(cmd: str, cwd, exports: dict, tree: str | None, env: dict) -> str:
    return json.dumps([cmd, cwd, sorted(exports.items()), tree, sorted(env.items())], default=str)
