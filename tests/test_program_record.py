"""`tttr record -- PROGRAM`: a user's program, run in the sandbox against the in-process
server, recorded as one run: setup, the model calls, the program's output and exit code,
the start and end trees, the check's verdict. Same --seed and --clock, same clock and
random numbers inside the program."""

from __future__ import annotations

import json
import os
import sqlite3
import textwrap

import pytest

from tttr.app.cli import main
from tttr.recorders.treestate import tree_at
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import program_tree, record_one_call, record_program

PROGRAM = textwrap.dedent("""\
    import datetime, random
    print(datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S"))
    print(random.random())
    from openai import OpenAI
    client = OpenAI()
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi"}],
                                       max_tokens=4, temperature=0)
    open("answer.txt", "w").write(r.choices[0].message.content or "")
    print("answered")
""")


@pytest.mark.slow
@needs_sandbox
def test_program_records_one_run_and_repeats_clock_and_randomness(tmp_path, capsys):
    db = tmp_path / "s.db"
    first = record_program(capsys, db, program_tree(tmp_path, "a", PROGRAM))
    second = record_program(capsys, db, program_tree(tmp_path, "b", PROGRAM))
    assert first["exit_code"] == 0 and first["calls"] == 1, first
    lines = first["stdout"].splitlines()
    assert lines[0] == "2026-03-02 10:00:00"
    assert lines[:2] == second["stdout"].splitlines()[:2]  # same --seed and --clock: same values
    assert not (tmp_path / "a" / "answer.txt").exists()  # recorded in a copy: --tree is left as it was
    with Store.open(db, readonly=True) as store:
        assert "answer.txt" in tree_at(store, first["run_id"]).files  # the end tree is in the database
        run, events = store.load_run(first["run_id"])
        assert run.task == "program:python3" and run.status == "complete"
        kinds = [(e.step, e.kind) for e in events]
        assert kinds[:2] == [(-1, "clock"), (-1, "setup")] and (0, "prompt") in kinds and (0, "message") in kinds
        assert events[0].site == "setup:clock" and events[0].value == {"t": "2026-03-02T10:00:00"}
        assert kinds[-2:] == [(1, "tool"), (1, "outcome")]
        tool = events[-2].value
        assert tool["exit_code"] == 0 and tool["stdout"].startswith("2026-03-02 10:00:00")
        assert tool["snapshot"] and events[1].value["snapshot"] and tool["tree_after"] != tool["tree_before"]
        assert len(store.runs()) == 2  # each recording one run, the calls inside it
    assert main(["events", str(db), str(first["run_id"]), "--kind", "clock", "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["site"], e["value"]) for e in listed][:1] == [("setup:clock", {"t": "2026-03-02T10:00:00"})]
    read = listed[1:]  # the program's own clock, as it asked for its one call (issue 27)
    assert len(read) == 1 and read[0]["site"] == "0:clock" and read[0]["value"]["source"] == "program"
    assert read[0]["value"]["t"].startswith("2026-03-02T10:00:00."), read


@pytest.mark.slow
@needs_sandbox
def test_exit_code_and_check_are_recorded(tmp_path, capsys):
    db = tmp_path / "s.db"
    noisy = "import sys\nsys.stdout.write('x' * 3_000_000)\nraise SystemExit(3)\n"  # megabytes, no model call
    fails = record_program(capsys, db, program_tree(tmp_path, "a", noisy), "--check", "test -f done")
    assert fails["exit_code"] == 3 and fails["passed"] is False and fails["calls"] == 0
    assert "output truncated: 3000000 bytes" in fails["stdout"]
    ok = record_program(capsys, db, program_tree(tmp_path, "b", "open('done', 'w').write('x')\n"),
                        "--check", "test -f done")
    assert ok["exit_code"] == 0 and ok["passed"] is True
    hangs = record_program(capsys, db, program_tree(tmp_path, "c", "import time\ntime.sleep(60)\n"), "--timeout", "2")
    assert hangs["exit_code"] == 124 and hangs["limit_hit"] == "timeout"
    crash = "import os, signal\nprint('before', flush=True)\nos.kill(os.getpid(), signal.SIGSEGV)\n"
    crashes = record_program(capsys, db, program_tree(tmp_path, "d", crash))
    assert crashes["exit_code"] == 128 + 11 and crashes["stdout"] == "before\n", crashes  # recorded, not raised
    with Store.open(db, readonly=True) as store:
        run, events = store.load_run(fails["run_id"])
        assert run.outcome["exit_code"] == 3 and run.outcome["passed"] is False
        tool = events[-2].value
        assert tool["truncated"] and tool["stdout_size"] == 3_000_000 and "$blob" in tool["stdout"]
        assert [r.status for r in store.runs()] == ["complete"] * 4  # each one a finished recording


def test_missing_program_is_refused_and_nothing_written(tmp_path, capsys):
    db = tmp_path / "s.db"
    tree = tmp_path / "t"
    tree.mkdir()
    code = main(["record", "--db", str(db), "--tree", str(tree), "--", "no-such-program-tttr", "x"])
    err = capsys.readouterr().err
    assert code == 2 and "not found" in err and len(err.strip().splitlines()) == 1
    assert not db.exists()
    code = main(["record", "--db", str(db), "--tree", str(tree), "--", "./missing.sh"])
    assert code == 2 and not db.exists()
    code = main(["record", "--db", str(db), "--tree", str(tree), "--", "python3", "agent.py"])
    assert code == 2 and "not in the tree" in capsys.readouterr().err and not db.exists()
    (tree / "agent.py").write_text("print(1)\n")  # there, but not executable: said so, not "not found"
    (tree / "sub").mkdir()
    for prog, said in (("./agent.py", "is not executable: chmod +x it"), ("./sub", "is a directory")):
        code = main(["record", "--db", str(db), "--tree", str(tree), "--", prog])
        err = capsys.readouterr().err
        assert code == 2 and said in err and "not found" not in err and err.count("\n") == 1, err
        assert not db.exists()


@pytest.mark.parametrize("argv", [
    ["record"],
    ["record", "--task", "write-line", "--", "true"],
    ["record", "--task", "write-line", "--check", "true"],
])
def test_task_and_program_are_exclusive(tmp_path, capsys, argv):
    db = tmp_path / "s.db"
    code = main([*argv[:1], "--db", str(db), *argv[1:]])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert not db.exists()


def test_existing_db_is_untouched_by_a_refused_program(tmp_path, capsys):
    db = tmp_path / "s.db"
    Store.open(db).close()
    before = db.read_bytes()
    assert main(["record", "--db", str(db), "--", "no-such-program-tttr"]) == 2
    assert db.read_bytes() == before
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 0


def test_tree_over_the_size_guard_is_refused(tmp_path, capsys):
    db = tmp_path / "s.db"
    tree = tmp_path / "big"
    tree.mkdir()
    with open(tree / "huge", "wb") as f:
        f.truncate(300 << 20)  # sparse: apparent size is what a snapshot would store
    assert main(["record", "--db", str(db), "--tree", str(tree), "--", "true"]) == 2
    assert "MiB" in capsys.readouterr().err and not db.exists()


@pytest.mark.slow
def test_unsafe_mode_reaches_the_model_over_the_hosts_loopback(tmp_path, capsys, monkeypatch):
    from dataclasses import replace

    import tttr.recorders.sandbox as sandbox_mod
    from tttr.recorders.probe import probe

    refused = replace(probe(), reason="bubblewrap cannot create namespaces here", bwrap=None, namespaces=False)
    monkeypatch.setattr(sandbox_mod, "probe", lambda: refused)
    db = tmp_path / "s.db"
    assert main(["record", "--db", str(db), "--", "true"]) == 2  # refused without the flag, nothing written
    assert "--unsafe-no-sandbox" in capsys.readouterr().err and not db.exists()
    record_one_call(capsys, db, program_tree(tmp_path, "a", PROGRAM), "--unsafe-no-sandbox", "--in-place")
    assert (tmp_path / "a" / "answer.txt").exists()  # --in-place: the program changed --tree itself


SDK_PROGRAM = textwrap.dedent("""\
    from tttr.recorders import sdk

    @sdk.tool
    def add(a, b):
        return a + b

    print(add(2, 3), sdk.now().strftime("%Y-%m-%d"))
""")


@pytest.mark.slow
@needs_sandbox
def test_the_sdk_inside_a_recorded_program_lands_in_its_run(tmp_path, capsys):
    db = tmp_path / "s.db"
    res = record_program(capsys, db, program_tree(tmp_path, "a", SDK_PROGRAM))
    assert res["exit_code"] == 0, res["stderr"]
    assert res["stdout"].split() == ["5", "2026-03-02"]  # the run's clock
    with Store.open(db, readonly=True) as store:
        assert len(store.runs()) == 1
        run, events = store.load_run(res["run_id"])
        kinds = [(e.step, e.kind) for e in events]
        assert (0, "tool") in kinds and (1, "clock") in kinds, kinds
        assert kinds[-2:] == [(2, "tool"), (2, "outcome")]


@pytest.mark.slow
@needs_sandbox
def test_recording_twice_starts_from_the_same_files_unless_in_place(tmp_path, capsys):
    """A program that writes its report once: recorded twice from one --tree, the second run
    does not find the first one's report (the program ran in a copy); --in-place changes the
    folder itself, and says it needs --tree."""
    tree, db = program_tree(tmp_path, "t", WRITES_ONCE), tmp_path / "s.db"
    first, second = (record_program(capsys, db, tree, "--check", "test -f report.txt") for _ in range(2))
    assert first["stdout"] == second["stdout"] == "writing the report\n", (first, second)
    assert sorted(os.listdir(tree)) == ["prog.py"]
    in_place = record_program(capsys, db, tree, "--in-place")
    assert in_place["stdout"] == "writing the report\n" and (tree / "report.txt").read_text() == "done\n"
    assert record_program(capsys, db, tree, "--in-place")["stdout"] == "the report is there already\n"
    assert main(["record", "--db", str(db), "--in-place", "--", "true"]) == 2
    assert "--in-place" in capsys.readouterr().err
    assert main(["record", "--db", str(db), "--task", "write-line", "--in-place"]) == 2
    assert "--in-place goes with -- PROGRAM" in capsys.readouterr().err


WRITES_ONCE = (
    "import os\n"
    "if os.path.exists('report.txt'):\n"
    "    print('the report is there already')\n"
    "else:\n"
    "    open('report.txt', 'w').write('done\\n')\n"
    "    print('writing the report')\n"
)
