"""`tttr fork RUN --at setup:file:PATH --set TEXT` and `--at setup:env:NAME --set VALUE` of a
recorded program: the new file is laid into the start tree the program runs from (never through
a link, only in a folder the start tree has), the variable is exported into its environment,
the child's setup records both, and a replay of the fork is identical."""

from __future__ import annotations

import os
import textwrap

import pytest

from tttr.app.cli import main
from tttr.engine.program.record import ProgramRunError
from tttr.engine.program.setup_values import exports, write_text
from tttr.recorders.snapshot import read_manifest
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import cli_json, program_tree, record_one_call, replay_json

PROGRAM = textwrap.dedent("""\
    import os
    from openai import OpenAI
    from tttr.recorders import sdk

    @sdk.tool
    def log(line):
        with open("log.txt", "a") as f:
            f.write(line + "\\n")
        return "ok"

    client = OpenAI()
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi"}],
                                       max_tokens=2, seed=3)
    log("called")
    print("notes:", open("notes.txt").read().strip())
    print("mode:", os.environ.get("MODE", "unset"))
    print("log:", open("log.txt").read().strip())
""")


def _lines(stdout: str) -> dict:
    return dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)


def _setup_and_end(db, run_id: int) -> tuple[dict, dict[str, bytes]]:
    """The run's setup value and its end tree's files (path -> bytes)."""
    with Store.open(db, readonly=True) as store:
        _, events = store.load_run(run_id)
        setup = next(e.value for e in events if e.site == "setup:setup")
        end = [e.value for e in events if e.kind == "tool" and isinstance(e.value.get("program"), list)][-1]
        files = {e.path: store.get_blob(e.ref) for e in read_manifest(end["snapshot"], store) if e.kind == "f"}
    return setup, files


@pytest.mark.slow
@needs_sandbox
def test_a_start_tree_file_and_a_variable_change_a_program_run_and_its_replay_is_identical(tmp_path, capsys):
    tree = program_tree(tmp_path, "tree", PROGRAM)
    (tree / "notes.txt").write_text("v1\n")
    (tree / "sub").mkdir()
    os.symlink("/etc", tree / "link")
    db = tmp_path / "s.db"
    rec = record_one_call(capsys, db, tree)
    rid = rec["run_id"]
    assert _lines(rec["stdout"]) == {"notes": "v1", "mode": "unset", "log": "called"}
    recorded_setup, _ = _setup_and_end(db, rid)

    res = cli_json(capsys, ["fork", str(rid), "--db", str(db), "--at", "setup:file:notes.txt", "--set", "v2",
                            "--json"])
    # The new file is read; the pinned SDK call's recorded effect (log.txt) is put back beside it.
    assert _lines(res["stdout"]) == {"notes": "v2", "mode": "unset", "log": "called"}, res
    assert res["forked"] is True and res["calls_generated"] == 0 and res["tools_run"] == 0, res
    setup, files = _setup_and_end(db, res["run_id"])
    assert setup["mutated"] == "setup:file:notes.txt" and setup["tree"] != recorded_setup["tree"]
    assert files["notes.txt"] == b"v2" and files["log.txt"] == b"called\n"
    with Store.open(db, readonly=True) as store:
        child = store.run(res["run_id"])
        start = {e.path: store.get_blob(e.ref) for e in read_manifest(setup["snapshot"], store) if e.kind == "f"}
    assert child.parent == rid and child.fork_site == "setup:file:notes.txt"
    assert child.mutation["value"] == {"path": "notes.txt", "text": "v2"}
    assert start["notes.txt"] == b"v2" and "log.txt" not in start
    again = replay_json(capsys, db, res["run_id"])
    assert again["identical"] is True and again["stdout"] == res["stdout"], again

    res = cli_json(capsys, ["fork", str(rid), "--db", str(db), "--at", "setup:env:MODE", "--set", "fast", "--json"])
    assert _lines(res["stdout"]) == {"notes": "v1", "mode": "fast", "log": "called"}, res
    setup, _ = _setup_and_end(db, res["run_id"])
    assert setup["exports"] == {"MODE": "fast"} and setup["mutated"] == "setup:env:MODE"
    assert setup["tree"] == recorded_setup["tree"]
    again = replay_json(capsys, db, res["run_id"])
    assert again["identical"] is True and "mode: fast" in again["stdout"], again

    # A new file in a folder the start tree has: there from the start.
    res = cli_json(capsys, ["fork", str(rid), "--db", str(db), "--at", "setup:file:sub/new.txt", "--set", "hello",
                            "--json"])
    assert _setup_and_end(db, res["run_id"])[1]["sub/new.txt"] == b"hello"

    # Refused in one line, exit 2, nothing written: a folder the start tree lacks, a link, a path
    # out of the tree, the variables tttr gives the program or the sandbox needs.
    with Store.open(db, readonly=True) as store:
        runs = len(store.runs())
    for at, why in (("setup:file:missing/x.txt", "no folder"), ("setup:file:link/passwd", "no folder"),
                    ("setup:file:../x", "not a path inside"), ("setup:file:sub", "a folder"),
                    ("setup:env:OPENAI_BASE_URL", "set by tttr"), ("setup:env:PATH", "set by tttr"),
                    ("setup:env:TTTR_RUN", "not a variable"), ("setup:env:LD_PRELOAD", "not a variable")):
        assert main(["fork", str(rid), "--db", str(db), "--at", at, "--set", "x"]) == 2, at
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and why in err, (at, err)
    with Store.open(db, readonly=True) as store:
        assert len(store.runs()) == runs


def test_a_start_tree_file_is_written_without_following_a_link(tmp_path):
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    tree.mkdir()
    outside.mkdir()
    (outside / "secret").write_text("keep")
    os.symlink(outside / "secret", tree / "notes.txt")
    os.symlink(outside, tree / "d")
    for path in ("notes.txt", "d/x.txt"):
        with pytest.raises(ProgramRunError, match=f"setup:file:{path}"):
            write_text(tree, path, "planted")
    assert (outside / "secret").read_text() == "keep" and sorted(os.listdir(outside)) == ["secret"]
    write_text(tree, "new.txt", "made")
    assert (tree / "new.txt").read_text() == "made"


def test_a_setup_s_variables_from_a_database_are_only_those_a_fork_could_set():
    setup = {"exports": {"MODE": "a", "LD_PRELOAD": "/x.so", "OPENAI_BASE_URL": "http://x", "TTTR_RUN": "r",
                         "bad name": "z", "N": 5, "Z": "a\0b", "PYTHONPATH": "/p"}}
    assert exports(setup) == {"MODE": "a"}
    assert exports({"exports": ["MODE"]}) == {} and exports({}) == {} and exports(None) == {}
