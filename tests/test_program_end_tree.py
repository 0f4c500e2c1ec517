"""A program replay's "end tree identical" verdict compares files, not times: the start tree is
restored and the program's own file comes with its time on disk now, so a replay that leaves
the same files (paths, kinds, modes, bytes) is the same tree, and one that leaves other files or
modes is not. Real sandbox and store; the program makes no model call."""

from __future__ import annotations

import os
import textwrap

import pytest

from tttr.engine.program.replay import same_files
from tttr.recorders.snapshot import snapshot
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import cli_json, program_tree, replay_json

PROGRAM = textwrap.dedent("""\
    from tttr.recorders import sdk

    @sdk.tool
    def note(text):
        with open("log.txt", "a") as f:
            f.write(text + "\\n")
        return len(text)

    print(note("hello"))
""")


def test_same_files_ignores_times_and_the_program_but_not_content_or_modes(tmp_path):
    tree = tmp_path / "t"
    tree.mkdir()
    (tree / "a.txt").write_text("a\n")
    (tree / "prog.py").write_text("print(1)\n")
    with Store.open(tmp_path / "s.db", create=True) as store:
        first = snapshot(tree, store)
        os.utime(tree / "a.txt", ns=(10**18, 10**18))
        os.utime(tree, ns=(10**18, 10**18))
        (tree / "prog.py").write_text("print(2)  # edited\n")
        later = snapshot(tree, store)
        assert later != first and same_files(store, first, later, "prog.py")
        assert not same_files(store, first, later, None)  # the program's file counts where it is not named
        os.chmod(tree / "a.txt", 0o600)
        assert not same_files(store, first, snapshot(tree, store), "prog.py")
        os.chmod(tree / "a.txt", 0o644)
        (tree / "a.txt").write_text("b\n")
        assert not same_files(store, first, snapshot(tree, store), "prog.py")
        assert not same_files(store, "0" * 64, first, "prog.py")  # a recorded end tree the store lacks: not the same


@pytest.mark.slow
@needs_sandbox
def test_a_replay_after_the_program_file_was_touched_leaves_the_same_tree(tmp_path, capsys):
    tree = program_tree(tmp_path, "tree", PROGRAM)
    db = tmp_path / "s.db"
    rec = cli_json(capsys, ["record", "--db", str(db), "--tree", str(tree), "--json", "--", "python3", "prog.py"])
    assert rec["exit_code"] == 0 and rec["stdout"] == "5\n", rec
    os.utime(tree / "prog.py", ns=(10**18, 10**18))  # a checkout, an editor's save: same bytes, another time
    res = replay_json(capsys, db, rec["run_id"], "--code", str(tree))
    assert res["identical"] is True and res["same_tree"] is True and res["tools_run"] == 0, res

    # Another file left behind (the program writes it itself, outside the SDK): not the same tree.
    (tree / "prog.py").write_text(PROGRAM + "open('extra.txt', 'w').write('x')\n")
    res = replay_json(capsys, db, rec["run_id"], "--code", str(tree))
    assert res["identical"] is True and res["same_tree"] is False, res
