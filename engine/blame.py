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

import json
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
    trees.tree_digest(asked)  # a step the run does not have fails here, naming its steps
    digests = trees.digests_through(asked)
    rows: dict[str, Any] = {}  # tree digest -> the path's row in its manifest (None: not there)

    def row(at: int):
        digest = digests(at)
        if digest is None:  # no tree recorded yet (a run without a starting tree): no files
            return None
        if digest not in rows:
            rows[digest] = _row_of(store, trees, at, digest, wanted, run_id)
        return rows[digest]

    target = row(asked)
    k = asked
    while k > SETUP_STEP:
        if digests(k - 1) != digests(k) and row(k - 1) != target:
            break
        k -= 1
    entry = _entry(trees, k, wanted)
    if k == SETUP_STEP:
        if target is None:
            raise TreeStateError(f"no file or directory {path!r} in run {run_id} at or before step {_written(asked)}")
        return Blame(run_id, wanted, asked, SETUP_STEP, trees.tree_digest(SETUP_STEP)[1], _seq(store, run_id, SETUP),
                     "in the starting tree", None, entry)
    change = "removed" if target is None else "added" if row(k - 1) is None else "changed"
    site = trees.tree_digest(k)[1]
    event = store.event_at(run_id, site) if site else None
    return Blame(run_id, wanted, asked, k, site, getattr(event, "seq", None), change, _command(event), entry)


def _row_of(store, trees: RunTrees, step: int, digest: str, path: str, run_id: int):
    """The row of `path` in the manifest of the tree after `step`, read by finding the path
    in the manifest's JSON rather than parsing every entry (a manifest lists each path once,
    as a JSON array starting with the path). The rows found are compared, never trusted: the
    entries blame returns are read through `read_manifest`'s checks."""
    manifest = trees.manifest_of(digest)
    if manifest is None:
        raise TreeStateError(f"run {run_id} after step {_written(step)}: no snapshot of tree {digest[:12]} is in "
                             "the database (the run recorded its digest only)")
    try:
        text = store.get_blob(manifest).decode("ascii")
    except Exception as exc:  # noqa: BLE001 - a missing or damaged manifest: say so, as `files` does
        raise TreeStateError(f"run {run_id} after step {_written(step)}: its tree's manifest cannot be read "
                             f"({exc})") from None
    at = text.find("[" + json.dumps(path, ensure_ascii=True) + ",")
    if at < 0:
        return None
    try:
        return tuple(_DECODER.raw_decode(text, at)[0])
    except (ValueError, TypeError):
        raise TreeStateError(f"run {run_id} after step {_written(step)}: its tree's manifest is damaged") from None


def _entry(trees: RunTrees, step: int, path: str):
    tree = trees.at(step)
    return tree.files.get(path) if tree.note is None else None


_DECODER = json.JSONDecoder()


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


def files_named(command: str, files, cwd: str | None = None) -> list[str]:
    """The paths of `files` (a tree's paths) that `command`'s words name, in the order they
    appear: what a command such as `cat greeting.txt` most likely read. Words are split as a
    shell would (quotes kept together); `./x` and `CWD/x` name `x`."""
    import shlex

    try:
        words = shlex.split(command, comments=True)
    except ValueError:  # an unclosed quote: split on spaces
        words = command.split()
    prefix = (cwd or "").rstrip("/") + "/" if cwd else None
    found: list[str] = []
    for word in words:
        for part in word.replace(">", " ").replace("<", " ").split():
            if prefix and part.startswith(prefix):
                part = part[len(prefix):]
            part = part.removeprefix("./").strip("/")
            if part and part in files and part not in found and part != ".":
                found.append(part)
    return found


def blame_command_input(store, run_id: int, step: int, command: str, cwd: str | None = None,
                        *, trees: RunTrees | None = None) -> Blame | None:
    """Where the input of step `step`'s command came from: `blame` of the first file of the
    tree before that step that the command names, as of the step before; None when it names
    none."""
    if step <= SETUP_STEP:
        return None
    trees = trees or RunTrees(store, run_id)
    before = trees.at(step - 1)
    if before.note is not None:
        raise TreeStateError(f"run {run_id} before step {step}: {before.note}")
    named = files_named(command, before.files, cwd)
    return blame(store, run_id, named[0], step - 1, trees=trees) if named else None
