"""A program fork's setup values: a file of the start tree (`setup:file:PATH`) and a variable
the program starts with (`setup:env:NAME`), taken as the built-in agent's forks take them
(engine/replay/mutation.py's grammar and checks: a relative path in a folder the start tree
has, a regular file or a new one; a variable's name, not TTTR_… or LD_…).

The file is written into the start tree the program runs from, through directory descriptors
that never follow a link (recorders/treeio.py); the variable is exported into the program's
environment. The child's setup records its start tree, the variables and the changed sites
(`mutated`), so a replay of the fork starts from that tree with those variables. An SDK
function answered from the recording puts its recorded files back (engine/serve/sdk_tree.py):
in such a fork the new files stay where the recording had not changed them (`carry`), and the
call's event records the tree this run had, so a replay of the fork is identical."""

from __future__ import annotations

import re
from pathlib import Path

from tttr.engine.program.record import ProgramRunError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED = ("TTTR_", "LD_")  # the sandbox's own (engine/replay/mutation.py refuses them too)


def runner_env() -> frozenset[str]:
    """The variables tttr itself gives a recorded program (its model endpoint, the SDK's import
    path, the tools' PATH): a fork cannot start the program with other values of these."""
    from tttr.recorders.program import endpoint_env

    return frozenset(endpoint_env("", "")) | {"PATH", "PYTHONPATH"}


def check(store, run_id: int, site_text: str, value_text: str) -> dict:
    """The new value at `setup:file:PATH` ({"path", "text"}) or `setup:env:NAME` ({"name",
    "value"}) of program run `run_id`, checked against its recorded setup and start tree;
    ProgramRunError (one line) when it cannot be set."""
    from tttr.engine.replay.mutation import MutationError, parse_mutation

    try:
        value = parse_mutation(store, run_id, site_text, value_text).value
    except MutationError as exc:
        raise ProgramRunError(str(exc)) from None
    if "name" in value and value["name"] in runner_env():
        raise ProgramRunError(f"setup:env:{value['name']} is set by tttr for the program (its model endpoint, "
                              "the SDK's import path or PATH): set another variable")
    return value


def lay(changes, setup: dict, tree_dir: Path, store) -> dict:
    """The setup a fork with `changes` (engine/program/fork.py's Change, at setup:file or
    setup:env) starts with: each new file written into `tree_dir` (the restored start tree),
    the tree snapshotted into `store` again, each variable added to the exports."""
    from tttr.recorders.snapshot import snapshot

    files = [c for c in changes if c.site.name == "file"]
    variables = [c for c in changes if c.site.name == "env"]
    if not files and not variables:
        return setup
    out = dict(setup)
    for c in files:
        write_text(tree_dir, c.value["path"], c.value["text"])
    if files:
        out["tree"] = out["snapshot"] = snapshot(tree_dir, store)  # a manifest's digest is its tree's
    if variables:
        out["exports"] = {**exports(setup), **{c.value["name"]: c.value["value"] for c in variables}}
    out["mutated"] = ", ".join(str(c.site) for c in (*files, *variables))
    return out


def carry(tree, recorded: dict, start: str | None, files: dict[str, str], store) -> dict:
    """A pinned SDK function's recorded effects on the files, in a fork whose start tree has
    new `files` ({path: text}): `tree` (the server's SDKTree) is moved to the recorded
    `tree_after`, then each new file the recording had left as it was in its start tree
    (manifest `start`) is written again, so the fork's change outlives the call; a file the
    recording changed by then keeps the recording's content. The call's `tree_after` and
    `snapshot` as this run has them (a replay of the fork puts back the same files)."""
    from tttr.recorders.errors import SnapshotError
    from tttr.recorders.snapshot import read_manifest, snapshot

    manifest = recorded.get("snapshot")
    if isinstance(manifest, str) and isinstance(start, str):
        tree.move_to(recorded)
        try:
            was, now = _contents(read_manifest(start, store)), _contents(read_manifest(manifest, store))
        except SnapshotError:  # a damaged database's manifest: the recorded files, as they were put back
            was, now = {}, None
        for path, text in files.items():
            folder = path.rpartition("/")[0]
            if now is not None and was.get(path) == now.get(path) and (not folder or now.get(folder) == ("d",)):
                write_text(tree.tree, path, text)
    changed = isinstance(manifest, str)
    return {"tree_after": tree.digest(), "snapshot": snapshot(tree.tree, store) if changed else None}


def _contents(entries) -> dict[str, tuple]:
    """path -> what a file's content is (kind, mode, size, ref); a folder is ("d",). Times aside."""
    return {e.path: ("d",) if e.kind == "d" else (e.kind, e.mode, e.size, e.ref) for e in entries}


def exports(setup: dict) -> dict[str, str]:
    """The variables a program run's setup starts it with (a fork's setup:env values; none in a
    recording). A database's value is data: only text names and values a fork could have set."""
    value = setup.get("exports") if isinstance(setup, dict) else None
    if not isinstance(value, dict):
        return {}
    reserved = runner_env()
    return {k: v for k, v in value.items()
            if isinstance(k, str) and isinstance(v, str) and _NAME.match(k) and not k.startswith(_RESERVED)
            and k not in reserved and "\0" not in v}


def write_text(tree_dir: Path, path: str, text: str) -> None:
    """Set the text of the file at `path` (relative, "/"-separated, checked already) in
    `tree_dir`, one directory at a time, never following a link; a file's mode is kept."""
    from tttr.recorders.treeio import NotRegularFile, write_beneath

    try:
        write_beneath(str(tree_dir), path, text.encode("utf-8", "surrogateescape"))
    except NotRegularFile:
        raise ProgramRunError(f"setup:file:{path}: not a regular file in the start tree") from None
    except OSError as exc:
        raise ProgramRunError(f"setup:file:{path}: cannot write it in the start tree ({exc.strerror})") from None


__all__ = ["carry", "check", "exports", "lay", "runner_env", "write_text"]
