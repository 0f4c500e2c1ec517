"""The program's tree around its SDK tool calls: the built-in agent's snapshot semantics.

A runner (`tttr record -- PROGRAM`, its replay and fork) gives the server the host directory
the program runs in (`Server.sdk_tree`). Then, as for the built-in agent's commands
(engine/replay/world.py), every SDK tool event records `tree_after` (the tree's digest when
the SDK posted the outcome) and `snapshot` (its manifest, stored content-addressed, when the
call changed the tree), and an `sdk.shell` command also `tree_before` (the digest when the
SDK asked, before running it). On replay a shell command is a cassette: it is answered from
the recording only when its command, cwd, timeout and `tree_before` all match; and whenever
a pinned tool call (a command or an `@sdk.tool` function) is answered without running, the
tree is moved to the recorded `tree_after`, so the files it wrote are there for the rest of
the program, as if it had run.

The digests here are of the tree's content (paths, kinds, modes, bytes), not of its times:
a file the program writes itself gets a new mtime in every run (the sandbox's clock does
not reach file times), and that must not make a replay miss its cassette.

The program waits for each post's answer, so the tree is read while it is not writing (a
program whose own threads or background processes write meanwhile records what was there)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
import time
from pathlib import Path

from tttr.recorders import treeio
from tttr.recorders.errors import SnapshotError
from tttr.recorders.snapshot import Entry, place, read_manifest, scan, snapshot


def program_file(argv: list[str]) -> str | None:
    """The program's own file, relative to its tree: `python3 X.py`'s X.py, or ./prog."""
    from tttr.recorders.program import PYTHON

    if len(argv) > 1 and PYTHON.fullmatch(Path(argv[0]).name) and not argv[1].startswith(("-", "/")):
        return argv[1]
    if "/" in argv[0] and not argv[0].startswith("/"):
        return argv[0]
    return None


class SDKTree:
    """The program's tree (a host directory) and the store its snapshots go to."""

    def __init__(self, tree: Path | str, store, recorded_since: str | None = None, program: str | None = None):
        self.tree = Path(tree)
        self.store = store
        # The program's own file (relative to the tree): not part of the cassette's key (an
        # edited program replays against its recording) and never put back.
        self.program = program
        # When the recording began (its run's `created`, ISO): a recorded time from then on is
        # one its program wrote, which the sandbox clamped to the virtual clock at the end.
        self.since_ns = _ns(recorded_since)
        self._lock = threading.Lock()
        self._before: dict[tuple[str, str], str] = {}  # (run, cmd) -> digest when the SDK asked
        self._seen: dict[str, str] = {}  # run -> the tree's digest at its last SDK tool event
        self.moved = 0  # pinned calls whose recorded effects were put back

    def digest(self) -> str:
        return content_digest(self.tree, skip=self.program)

    def asked(self, run: str, value: dict) -> dict:
        """A command's query (before it runs): `value` with the tree's digest as `tree_before`."""
        before = self.digest()
        with self._lock:
            self._before[(run, value["cmd"])] = before
            self._seen[run] = before
        return {**value, "tree_before": before}

    def outcome(self, run: str, value: dict) -> dict:
        """A tool's outcome (after it ran): `value` with `tree_before` (commands: from its
        query), `tree_after` and `snapshot` (the manifest when the tree changed, else None)."""
        after = self.digest()
        out = dict(value)
        with self._lock:
            before = self._before.pop((run, value["cmd"]), None) if "cmd" in value else None
            seen, self._seen[run] = self._seen.get(run), after
        if before is not None:
            out["tree_before"] = before
        # A function has no before: its snapshot is kept unless the tree is as the last event left it.
        changed = after != (before if before is not None else seen)
        out["tree_after"] = after
        out["snapshot"] = snapshot(self.tree, self.store) if changed else None
        return out

    def move_to(self, recorded: dict) -> bool:
        """Put the tree in the state a pinned call left it in (its recorded `tree_after`,
        from the nearest snapshot of it); False when the recording has none to restore."""
        after, manifest = recorded.get("tree_after"), recorded.get("snapshot")
        if not after or not manifest or self.digest() == after:
            return False
        sync_tree(self.tree, manifest, self.store, self.since_ns, keep=self.program)
        self.moved += 1
        return True


def sync_tree(tree: Path, manifest: str, store, since_ns: int | None = None, keep: str | None = None) -> None:
    """Make the existing directory `tree` hold exactly the snapshot `manifest`: what the
    snapshot lacks is removed, what differs is replaced (the directory itself stays, so a
    sandbox that has it mounted sees the change); what is the same is left alone, times
    included. A replaced entry gets its recorded time if that is older than `since_ns`, else
    the time now, as if the command had just written it: the sandbox then clamps it to the
    virtual clock at the program's end, as it did the recorded one. `keep` (a relative path)
    is left as it is, whatever the snapshot holds. Owners follow the root.

    The program owns the tree and may have planted links anywhere in it (a stranger's
    database chose the program): every step goes through recorders/treeio.py, relative to
    directory descriptors, following no link, writing new names with O_EXCL."""
    wanted = {e.path: e for e in read_manifest(manifest, store) if e.path != keep}
    top = wanted.pop(".", None)
    root = str(Path(tree).resolve())
    old = {e.path: e for e in scan(root)}
    written: list[str] = []
    with treeio.opened_root(root) as root_fd:
        for dir_fd, rel, name, st in treeio.walk(root_fd):  # a directory removed here is not entered
            e = wanted.get(rel)
            if rel == keep or (e is not None and e.kind == _kind(st)):
                continue
            treeio.remove_at(dir_fd, name)
            written.append(rel.rpartition("/")[0] or ".")
        dirs = treeio.DirCache(root_fd)
        try:
            for rel, e in sorted(wanted.items(), key=lambda kv: (kv[0].count("/"), kv[0])):
                parent, _, name = rel.rpartition("/")
                pfd = dirs.get(parent or ".")
                now = treeio.lstat_at(pfd, name)
                was = old.get(rel) if now is not None else None
                if was is not None and (was.kind, was.size, was.ref, was.mode) == (e.kind, e.size, e.ref, e.mode):
                    continue  # the same entry: left as it is
                if place(dirs, e, store, now):
                    written += [rel, parent or "."]
            now_ns = time.time_ns()

            def when(e: Entry) -> int:
                return e.mtime_ns if since_ns is not None and e.mtime_ns < since_ns else now_ns

            for rel in sorted(set(written), key=lambda r: -r.count("/")):  # times last, deepest first
                e = wanted.get(rel)
                if rel != "." and e is not None:
                    parent, _, name = rel.rpartition("/")
                    treeio.set_time_at(dirs.get(parent or "."), name, when(e))
            if "." in written and top is not None:
                os.utime(root_fd, ns=(when(top), when(top)))
        except OSError as exc:  # the program changed the tree under us: its files are not put back
            raise SnapshotError(f"cannot put the recorded files back into the program's tree: {exc}") from None
        finally:
            dirs.close()
    if os.geteuid() == 0:  # as root the sandbox runs as another uid, which must keep owning the tree
        from tttr.recorders.treeown import hand_over

        st = os.lstat(root)
        hand_over(root, st.st_uid, st.st_gid)


def _ns(iso: str | None) -> int | None:
    if not iso:
        return None
    from datetime import datetime, timezone

    try:
        t = datetime.fromisoformat(iso)
    except (TypeError, ValueError):
        return None
    t = t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)
    return int(t.timestamp()) * 1_000_000_000


def content_digest(tree: Path | str, skip: str | None = None) -> str:
    """sha256 of the tree's entries without their times (and without `skip`, a relative path)."""
    rows = [(e.path, e.kind, e.mode, e.size, e.ref) for e in scan(tree) if e.path != skip]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def _kind(st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return "l"
    return "d" if stat.S_ISDIR(st.st_mode) else "f"
