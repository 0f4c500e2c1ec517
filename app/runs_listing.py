"""The runs list as the app reads it: never every run at once.

`RunsListing` is the runs screen's reader, as `RunView` is the timeline's. `read()` takes
every run's place in the fork tree from one narrow query (`Store.run_links`: id, parent,
recording); `rows(start, stop)` reads the rows of a window of that order, with their steps,
events and ancestors, in a fixed number of queries (`Store.run_rows`). The screen puts a
window in its table at a time, and the next one when the cursor or the scroll nears the
last row it has, so a database of 50,000 runs shows its first screen as fast as one of 5.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

MAX_DEPTH = 12  # tree levels drawn; a deeper fork is shown at this depth, its depth written out
PAGE = 200  # runs read into the table at a time


def fork_tree(runs: list) -> list[tuple[object, str]]:
    """(run, tree prefix) in display order: each run, then its forks and replays under it,
    recursively, by id. A run whose parent is not listed (or a cycle a hand-edited file
    made) is shown as a root, so every run is shown once. A run is anything with `id` and
    `parent` (a `Run`, a `RunLink`)."""
    ids = {run.id for run in runs}
    children: dict[int, list] = defaultdict(list)
    roots = []
    for run in runs:
        parent = run.parent
        if isinstance(parent, int) and parent in ids and parent != run.id:
            children[parent].append(run)
        else:
            roots.append(run)
    out: list[tuple[object, str]] = []
    seen: set[int] = set()

    def walk(root) -> None:
        stack = [(root, "", "", 0)]  # (run, prefix of its children's lines, its own glyph, depth)
        while stack:
            run, prefix, glyph, depth = stack.pop()
            if run.id in seen:
                continue
            seen.add(run.id)
            out.append((run, prefix + glyph if depth <= MAX_DEPTH else f"{prefix}…{depth} {glyph}"))
            kids = children.get(run.id, [])
            below = prefix if depth == 0 or depth >= MAX_DEPTH else prefix + ("   " if glyph == "└─ " else "│  ")
            for i in range(len(kids) - 1, -1, -1):
                stack.append((kids[i], below, "└─ " if i == len(kids) - 1 else "├─ ", depth + 1))

    for run in roots:
        walk(run)
    for run in runs:  # only a cycle of parents leaves runs unreached
        walk(run)
    return out


class ListedRun(NamedTuple):
    """A row of the runs list: the run with its counts and ancestors (`RunRow`), and its
    tree prefix (`├─ `)."""

    row: object  # sessions.run_list.RunRow
    prefix: str


class RunsListing:
    """The order of every run of the file, and their rows by window."""

    def __init__(self, store) -> None:
        self.store = store
        self.order: list[tuple[object, str]] = []  # (RunLink, prefix) in display order
        self.position: dict[int, int] = {}  # run id -> its index in `order`
        self.recording: list[int] = []  # ids of the runs being recorded now
        self._tree: list[tuple[int, int | None]] | None = None  # (id, parent) of each run when last read

    def read(self) -> None:
        """Read every run's place again (after the file changed). The tree is drawn again
        only when a run came, went or changed parent: a recorder's step changes none."""
        links = self.store.run_links()
        tree = [(link.id, link.parent) for link in links]
        if tree != self._tree:
            self._tree = tree
            self.order = fork_tree(links)
            self.position = {link.id: i for i, (link, _) in enumerate(self.order)}
        self.recording = [link.id for link in links if link.recording]

    def __len__(self) -> int:
        return len(self.order)

    def rows(self, start: int, stop: int) -> list[ListedRun]:
        """The rows of `order[start:stop]`; a run deleted since `read()` is left out."""
        window = self.order[start:stop]
        prefixes = {link.id: prefix for link, prefix in window}
        return [ListedRun(row, prefixes[row.run.id]) for row in self.store.run_rows(list(prefixes))]


def is_replay(run) -> bool:
    """A replay of its parent (`tttr replay`): a child run with no mutation."""
    return run.parent is not None and run.meta.replay is not None


def replay_verdict(store, run) -> str:
    """Whether replay `run` reproduced its parent: `identical`, or `diverged at SITE` (the
    first cause), from the quick scan the compare screen uses; never raises."""
    from tttr.engine.replay.diff import scan_runs

    try:
        diff = scan_runs(store, run.parent, run.id)
    except Exception as exc:  # noqa: BLE001 - a pair that cannot be compared says so in its row
        return f"not compared: {type(exc).__name__}"
    if diff.identical:
        return "identical"
    first = diff.first_cause
    return f"diverged at {first.site}" if first is not None else "differs in its steps"
