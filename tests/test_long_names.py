"""Names longer than a file name (issue 26): a run's task over 255 characters made `replay` and
`fork` fail with an OSError traceback ("File name too long") where the task's folder was
looked up. A task that no folder can name is refused in one line, with nothing written; a
recorded program whose file name is long (its run is `program:NAME`) replays and forks."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from sandbox_helpers import needs_sandbox
from test_hostile_db import build, fingerprint, run_cli, runs_in, set_run
from tests.program_helpers import cli_json, record_program

LONG_TASK = "write-line-" + "x" * 290


@pytest.fixture(scope="module")
def long_task_db(tmp_path_factory) -> Path:
    """Two complete runs of the default model whose task is 301 characters long."""
    from tttr.engine.replay.runtime import Runtime

    path = tmp_path_factory.mktemp("long") / "s.db"
    build(path, model_id=Runtime().model_id)
    set_run(path, "task", LONG_TASK, run=1)
    set_run(path, "task", "\0write-line", run=2)  # a NUL byte: no folder has that name either
    return path


@pytest.mark.parametrize("command", [["replay"], ["fork", "--at", "0:clock", "--set", "+1h"]], ids=lambda c: c[0])
@pytest.mark.parametrize("run", ["1", "2"])
def test_a_task_no_folder_can_name_is_refused_in_one_line_and_nothing_is_written(tmp_path, long_task_db, capsys,
                                                                               command, run):
    path = tmp_path / "s.db"
    shutil.copy(long_task_db, path)
    before, runs = fingerprint(path), runs_in(path)
    code, out, err = run_cli([command[0], run, *command[1:], "--db", str(path)], capsys)
    assert code == 2 and err.startswith("tttr: error: unknown task ") and err.count("\n") == 1, err
    assert "Traceback" not in err and out == ""
    assert runs_in(path) == runs and fingerprint(path) == before


PROGRAM = textwrap.dedent("""\
    #!/usr/bin/env python3
    from openai import OpenAI
    from tttr.recorders import sdk

    @sdk.tool
    def count(text):
        return len(text)

    client = OpenAI()
    r = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=4, seed=3,
                                       messages=[{"role": "user", "content": "Say hi"}])
    print(count(r.choices[0].message.content), sdk.now().isoformat())
""")


@pytest.mark.slow
@needs_sandbox
def test_a_program_with_a_long_file_name_records_replays_and_forks(tmp_path, capsys):
    """Its run is named program:NAME (258 characters here): the SDK's events were refused
    (the run header allowed 200), so the replay was not identical and the tool could not be forked."""
    name = "p" * 250 + ".py"
    tree, db = tmp_path / "tree", tmp_path / "s.db"
    tree.mkdir()
    (tree / name).write_text(PROGRAM)
    (tree / name).chmod(0o755)
    rec = record_program(capsys, db, tree, program=(f"./{name}",))
    assert rec["exit_code"] == 0 and rec["calls"] == 1 and rec["stderr"] == "", rec
    replay = cli_json(capsys, ["replay", str(rec["run_id"]), "--db", str(db), "--json"])
    assert replay["identical"] is True and replay["stdout"] == rec["stdout"], replay
    fork = cli_json(capsys, ["fork", str(rec["run_id"]), "--db", str(db), "--at", "1:tool", "--set", '{"result": 99}',
                             "--json"])
    assert fork["forked"] is True and fork["stdout"].startswith("99 "), fork


def test_record_of_a_task_name_longer_than_a_file_name_is_one_line_and_creates_nothing(tmp_path, capsys):
    from tttr.app.cli import main

    db = tmp_path / "new.db"
    assert main(["record", "--task", "x" * 300, "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "unknown task" in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not db.exists()
