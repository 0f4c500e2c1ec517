"""The sandbox's files at any step of a recorded run, and what differs between two such trees.

The trace recorder names the tree after every step by its digest (`tree_after` of a tool
event, `tree` of the setup) and stores a snapshot manifest (`snapshot.read_manifest`) the
first time a tree appears in a recording. The tree at step S is the tree after the last
command at or before S (the setup's tree at step -1, before the agent's first command).
A tree first seen in a fork's parent, or in the run a replay read from, has its manifest
recorded there, so the parents are searched too.

Everything here reads a store (or any object with `events`, `run`, `get_blob_part`,
`has_blob`, `get_blob`) and returns plain data: the command line and the app both show it.
File contents are untrusted: callers show them through `sessions.safe_text`.
"""

from __future__ import annotations

import bisect
import difflib
import stat
from dataclasses import dataclass, field
from typing import Callable

from tttr.recorders.errors import RecorderError, SnapshotError
from tttr.recorders.snapshot import Entry, read_manifest
from tttr.sessions.vocabulary import SETUP_STEP, site

SHOW_LIMIT = 256 * 1024   # bytes of one file read for showing; a larger file is said to be too large
DIFF_LINES = 2000         # lines of a text diff at most
CHANGES = ("added", "removed", "changed")


class TreeStateError(RecorderError):
    """A step or run whose tree cannot be named (a step outside the run)."""


@dataclass(frozen=True, slots=True)
class TreeAt:
    """The sandbox tree of `run` after `step`: its digest, the event that left it (`site`),
    and its entries when a snapshot of it is in the store (else `note` says why not)."""

    run: int
    step: int
    digest: str | None
    site: str | None
    entries: tuple[Entry, ...] = ()
    note: str | None = None

    @property
    def files(self) -> dict[str, Entry]:
        """Entries by path, the tree's own "." left out."""
        return {e.path: e for e in self.entries if e.path != "."}


@dataclass(frozen=True, slots=True)
class FileChange:
    path: str
    change: str            # added, removed or changed
    before: Entry | None
    after: Entry | None

    @property
    def what(self) -> str:
        """What changed, in words: content, mode, kind, time, or a combination."""
        if self.before is None or self.after is None:
            return self.change
        a, b = self.before, self.after
        parts = [name for name, differs in (
            ("kind", a.kind != b.kind), ("content", a.ref != b.ref or a.size != b.size),
            ("mode", a.mode != b.mode), ("time", a.mtime_ns != b.mtime_ns)) if differs]
        if "kind" in parts:
            return "kind"
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class TreeDiff:
    a: TreeAt
    b: TreeAt
    changes: tuple[FileChange, ...] = ()

    @property
    def same(self) -> bool:
        return self.a.digest == self.b.digest or (not self.changes and self.note is None)

    @property
    def note(self) -> str | None:
        """Why the files cannot be compared (a tree with no snapshot), else None."""
        return self.a.note or self.b.note

    def counts(self) -> dict[str, int]:
        return {c: sum(1 for x in self.changes if x.change == c) for c in CHANGES}


@dataclass(frozen=True, slots=True)
class FileText:
    """A file's contents for showing: `text` when it is text and not too large, else `note`
    ("binary, 1,024 bytes", "too large to show: 3,000,000 bytes", "a directory", …)."""

    text: str | None
    note: str | None = None


@dataclass(slots=True)
class _Trees:
    """The run's steps and their trees, with every manifest the run and its parents name."""

    run: int
    setup: str | None = None
    after: dict[int, tuple[str, str]] = field(default_factory=dict)  # step -> (tree digest, site)
    manifests: dict[str, str] = field(default_factory=dict)          # tree digest -> manifest digest
    last_step: int = SETUP_STEP
    unreadable: list[str] = field(default_factory=list)


def _trace_events(store, run_id: int) -> list:
    return [e for kind in ("setup", "tool") for e in store.events(run_id, kind=kind)]


def _collect(store, run_id: int) -> _Trees:
    trees = _Trees(run_id)
    for e in _trace_events(store, run_id):
        value = e.value
        if not isinstance(value, dict):
            trees.unreadable.append(e.site)
            continue
        digest = value.get("tree") if e.kind == "setup" else value.get("tree_after")
        if not isinstance(digest, str):
            continue
        if e.kind == "setup":
            trees.setup = digest
        else:
            trees.after[e.step] = (digest, e.site)
        if isinstance(value.get("snapshot"), str):
            trees.manifests.setdefault(digest, value["snapshot"])
    trees.last_step = max([store.steps(run_id) - 1, *trees.after], default=SETUP_STEP)
    return trees


class RunTrees:
    """The trees of one run, read once: `at(step)` for any step, without reading the store
    again for each. A script's entry point is `tree_at`; the app keeps one per run."""

    def __init__(self, store, run_id: int):
        self.store = store
        self.run_id = run_id
        store.run(run_id)  # an unknown run fails here, naming the runs there are
        self._trees = _collect(store, run_id)
        self._parents_read = False
        self._entries: dict[str, tuple[Entry, ...]] = {}

    @property
    def last_step(self) -> int:
        return self._trees.last_step

    def tree_digest(self, step: int) -> tuple[str | None, str | None]:
        """(digest, site of the event that left it) of the tree after `step`."""
        t = self._trees
        if not SETUP_STEP <= step <= t.last_step:
            last = "" if t.last_step < 0 else f", 0 to {t.last_step}"
            raise TreeStateError(f"run {self.run_id} has no step {step}: its steps are setup{last}")
        done = [s for s in t.after if s <= step]
        if done:
            return t.after[max(done)]
        return t.setup, (site(SETUP_STEP, "setup") if t.setup else None)

    def digests_through(self, last: int) -> Callable[[int], str | None]:
        """digest(step): the tree after any step up to `last` (`tree_digest`'s digest, the
        setup's before the first command), by a lookup per step: a walk back over many
        steps stays linear, where `tree_digest` scans every step at each call."""
        t = self._trees
        after = {step: digest for step, (digest, _) in t.after.items() if step <= last}
        steps = sorted(after)

        def digest(step: int) -> str | None:
            i = bisect.bisect_right(steps, step)
            return after[steps[i - 1]] if i else t.setup

        return digest

    def manifest_of(self, digest: str) -> str | None:
        """The digest of tree `digest`'s snapshot manifest, recorded by this run or a parent
        it was forked or replayed from; None when the store holds no snapshot of it."""
        return self._manifest(digest)

    def _manifest(self, digest: str) -> str | None:
        found = self._trees.manifests.get(digest)
        if found is None and not self._parents_read:
            self._parents_read = True
            parent = self.store.run(self.run_id).parent
            seen = {self.run_id}
            while isinstance(parent, int) and parent not in seen:  # a replay's or fork's parent
                seen.add(parent)
                for tree, manifest in _collect(self.store, parent).manifests.items():
                    self._trees.manifests.setdefault(tree, manifest)
                parent = self.store.run(parent).parent
            found = self._trees.manifests.get(digest)
        if found is None and self.store.has_blob(digest):  # a manifest's digest is its tree's
            found = digest
        return found

    def at(self, step: int) -> TreeAt:
        digest, where = self.tree_digest(step)
        if digest is None:
            return TreeAt(self.run_id, step, None, None, (), f"run {self.run_id} recorded no tree at step {step}")
        entries = self._entries.get(digest)
        if entries is None:
            manifest = self._manifest(digest)
            if manifest is None:
                return TreeAt(self.run_id, step, digest, where, (),
                              f"no snapshot of tree {digest[:12]} is in the database (the run recorded its digest only)")
            try:
                entries = tuple(read_manifest(manifest, self.store))
            except SnapshotError as exc:
                return TreeAt(self.run_id, step, digest, where, (), str(exc))
            self._entries[digest] = entries
        return TreeAt(self.run_id, step, digest, where, entries)


    def at_or_final(self, step: int | None) -> TreeAt:
        """The tree after `step`, or the run's final tree when it ended before `step` (or
        `step` is None): how the same step of two runs of different lengths compares."""
        return self.at(self.last_step if step is None else min(step, self.last_step))


def tree_at(store, run_id: int, step: int | None = None) -> TreeAt:
    """The files of run `run_id` after `step` (default: its last step)."""
    trees = RunTrees(store, run_id)
    return trees.at(trees.last_step if step is None else step)


def diff_trees(a: TreeAt, b: TreeAt) -> TreeDiff:
    """Paths added, removed and changed (content, mode, kind or time) from tree a to tree b."""
    if a.digest == b.digest or a.note or b.note:
        return TreeDiff(a, b)
    old, new = a.files, b.files
    changes = [FileChange(p, "added", None, new[p]) for p in new if p not in old]
    changes += [FileChange(p, "removed", old[p], None) for p in old if p not in new]
    changes += [FileChange(p, "changed", old[p], new[p]) for p in new if p in old and old[p] != new[p]]
    return TreeDiff(a, b, tuple(sorted(changes, key=lambda c: c.path)))


def diff_manifests(store, before: str | None, after: str) -> tuple[FileChange, ...]:
    """What changed from the tree of manifest `before` (None: an empty tree) to that of
    `after`, by path: the same FileChange rows as `diff_trees`. SnapshotError when either
    manifest cannot be read."""
    a = TreeAt(0, 0, before, None, tuple(read_manifest(before, store)) if before else ())
    b = TreeAt(0, 0, after, None, tuple(read_manifest(after, store)))
    if before is None:  # an empty tree before: everything the after tree holds was added
        return tuple(FileChange(p, "added", None, e) for p, e in sorted(b.files.items()))
    return diff_trees(a, b).changes


def diff_steps(store, run_id: int, step_a: int, step_b: int) -> TreeDiff:
    trees = RunTrees(store, run_id)
    return diff_trees(trees.at(step_a), trees.at(step_b))


def diff_runs_at(store, run_a: int, run_b: int, step: int | None = None) -> TreeDiff:
    """The same step of two runs (a fork and its parent, two seeds of a task); a run that
    ended before `step` gives its final tree. Default: both runs' final trees."""
    return diff_trees(RunTrees(store, run_a).at_or_final(step), RunTrees(store, run_b).at_or_final(step))


def mode_text(entry: Entry) -> str:
    """`ls -l`'s mode column: `-rw-r--r--`, `drwxr-xr-x`, `lrwxrwxrwx`."""
    kind = {"d": stat.S_IFDIR, "l": stat.S_IFLNK}.get(entry.kind, stat.S_IFREG)
    return stat.filemode(kind | (entry.mode & 0o7777 if isinstance(entry.mode, int) else 0))


def change_text(change: FileChange) -> str:
    """What changed, for one line: `content`, `mode -rw-r--r-- → -rwxr-xr-x`, `added, 12 bytes`."""
    if change.before is None or change.after is None:
        entry = change.after or change.before
        size = f", {entry.size:,} bytes" if entry.kind == "f" and isinstance(entry.size, int) else ""
        return f"{change.change}{size}"
    what = change.what
    if "mode" in what:
        what = what.replace("mode", f"mode {mode_text(change.before)} → {mode_text(change.after)}")
    return what


def file_text(store, entry: Entry | None, limit: int = SHOW_LIMIT) -> FileText:
    """What a file holds, for showing: text, or why it is not shown."""
    if entry is None:
        return FileText("", "absent")
    if entry.kind == "d":
        return FileText(None, "a directory")
    if entry.kind == "l":
        return FileText(None, f"a symbolic link to {entry.ref}")
    if not isinstance(entry.size, int) or not isinstance(entry.ref, str):
        return FileText(None, "contents not readable: a damaged manifest entry")
    if entry.size > limit:
        return FileText(None, f"too large to show: {entry.size:,} bytes")
    try:
        part = store.get_blob_part(entry.ref, limit=limit)
    except Exception as exc:  # noqa: BLE001 - a missing or damaged blob is said, not raised
        return FileText(None, f"contents not readable: {exc}")
    data = part.data
    if part.truncated:
        return FileText(None, f"too large to show: {part.size or entry.size:,} bytes")
    if b"\0" in data[:8192]:
        return FileText(None, f"binary, {len(data):,} bytes")
    try:
        return FileText(data.decode("utf-8"))
    except UnicodeDecodeError:
        return FileText(None, f"binary (not UTF-8 text), {len(data):,} bytes")


def text_diff(store, change: FileChange, *, context: int = 3) -> FileText:
    """A unified diff of the file's text from before to after; a note for a binary or
    large file, a directory or a link."""
    before, after = file_text(store, change.before), file_text(store, change.after)
    for side in (before, after):
        if side.text is None:
            return FileText(None, side.note)
    lines = list(difflib.unified_diff(
        before.text.splitlines(), after.text.splitlines(),
        fromfile=f"a/{change.path}", tofile=f"b/{change.path}", lineterm="", n=context))
    if not lines:
        return FileText("", f"same content ({change.what} changed)")
    if len(lines) > DIFF_LINES:
        lines = lines[:DIFF_LINES] + [f"… {len(lines) - DIFF_LINES:,} more lines of diff"]
    return FileText("\n".join(lines))
