"""Where a file came from: the step and command that last wrote it (Pernosco's question).

`blame(store, run, path, step)` walks the run's trees back from `step` (default: its last)
through the trace layer's snapshots (`recorders.treestate.RunTrees`) to the step after which
the file's entry (content, mode, kind, time) is last different: that step's command wrote
it (or removed it, when the file is gone). A step that left the tree as it was is skipped
without reading its manifest, so a query costs one manifest read per step that changed the
tree between the write and `step`. Read-only; no textual, no printing: `tttr files --blame`
prints it, the app jumps to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tttr.recorders.treestate import RunTrees, TreeStateError
from tttr.sessions.vocabulary import SETUP, SETUP_STEP


@dataclass(frozen=True, slots=True)
class Blame:
    """Who last wrote `path` in run `run` as of step `asked` (`step`: SETUP_STEP when it
    came with the task's starting tree)."""

    run: int
    path: str
    asked: int
    step: int
    site: str | None  # the event that left the tree with the write (`2:tool`, `setup:setup`)
    seq: int | None  # that event's seq, for a timeline to jump to
    change: str  # "added", "changed", "removed" or "in the starting tree"
    command: str | None  # the command (or SDK call) of that step, as recorded
    entry: Any  # the file's entry after that step (None when removed)

    @property
    def step_text(self) -> str:
        return SETUP if self.step == SETUP_STEP else str(self.step)

    def describe(self) -> str:
        if self.step == SETUP_STEP:
            return f"{self.path}: in the task's starting tree (setup), unchanged since"
        by = f" by {self.command}" if self.command else ""
        return f"{self.path}: {self.change} at step {self.step_text}{by} ({self.site})"

    def to_json(self) -> dict:
        return {"run": self.run, "path": self.path, "asked_step": self.asked, "step": self.step, "site": self.site,
                "seq": self.seq, "change": self.change, "command": self.command}


def blame(store, run_id: int, path: str, step: int | None = None, *, trees: RunTrees | None = None) -> Blame:
    """The step and command that last wrote (or removed) `path` in run `run_id` as of
    `step`. TreeStateError when the run holds no snapshot to tell, or no such file ever was."""
    trees = trees or RunTrees(store, run_id)
    wanted = path.strip("/")
    asked = trees.last_step if step is None else step
    entries: dict[str, dict] = {}  # tree digest -> its files

    def entry(at: int):
        digest, _ = trees.tree_digest(at)
        if digest is None:  # no tree recorded yet (a run without a starting tree): no files
            return None
        files = entries.get(digest)
        if files is None:
            tree = trees.at(at)
            if tree.note is not None:
                raise TreeStateError(f"run {run_id} after step {_written(at)}: {tree.note}")
            files = entries[digest] = tree.files
        return files.get(wanted)

    target = entry(asked)
    k = asked
    later_digest = trees.tree_digest(k)[0]
    while k > SETUP_STEP:
        digest = trees.tree_digest(k - 1)[0]
        if digest != later_digest and entry(k - 1) != target:
            break
        k, later_digest = k - 1, digest
    if k == SETUP_STEP:
        if target is None:
            raise TreeStateError(f"no file or directory {path!r} in run {run_id} at or before step {_written(asked)}")
        return Blame(run_id, wanted, asked, SETUP_STEP, trees.tree_digest(SETUP_STEP)[1], _seq(store, run_id, SETUP),
                     "in the starting tree", None, target)
    before = entry(k - 1)
    change = "removed" if target is None else "added" if before is None else "changed"
    site = trees.tree_digest(k)[1]
    event = store.event_at(run_id, site) if site else None
    return Blame(run_id, wanted, asked, k, site, getattr(event, "seq", None), change, _command(event), target)


def _written(step: int) -> str:
    return SETUP if step == SETUP_STEP else str(step)


def _seq(store, run_id: int, step_name: str) -> int | None:
    event = store.event_at(run_id, f"{step_name}:setup")
    return getattr(event, "seq", None)


def _command(event) -> str | None:
    value = getattr(event, "value", None)
    if not isinstance(value, dict):
        return None
    cmd = value.get("cmd")
    if isinstance(cmd, str):
        return cmd
    function = value.get("function")
    return f"{function}(…)" if isinstance(function, str) else None
