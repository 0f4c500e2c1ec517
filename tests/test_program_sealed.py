"""Replay against today's code (issue 32): `tttr replay RUN --code DIR [-- PROGRAM ARG...]`
lays today's files over the recorded start tree (and may run another command line);
`--sealed` runs nothing live (no model, no SDK tool), ends at the first call the recording
cannot answer with exit code 1, and the program gets an error it can surface; `--json` says
where (call, step, site, field path, both values). Bad input: one line, exit 2, nothing written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tttr.app.cli import main
from tttr.engine.program.replay import request_field
from sandbox_helpers import needs_sandbox
from tests.program_helpers import cli_json, program_tree, record_one_call, record_program

EXAMPLES = Path(__file__).resolve().parents[1] / "assets" / "examples"
TASK = Path(__file__).resolve().parents[1] / "assets" / "tasks" / "write-line"
ASKED = "What is the file name? Reply with the name only."


def _tree(tmp_path: Path, name: str, program: str = "openai_agent.py") -> Path:
    tree = tmp_path / name
    tree.mkdir()
    (tree / "README").write_text("greeting.txt should say hello world\n")
    shutil.copy(EXAMPLES / "openai_agent.py", tree / program)
    shutil.copy(TASK / "check.sh", tree / "check.sh")
    return tree


def _replay(capsys, db: Path, run: int, *more: str) -> tuple[int, dict]:
    code = main(["replay", str(run), "--db", str(db), "--json", *more])
    out = capsys.readouterr().out
    return code, json.loads(out.strip().splitlines()[-1])


def _refused(capsys, db: Path, argv: list[str], says: str) -> None:
    before = db.read_bytes()
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and says in err, err
    assert db.read_bytes() == before


@pytest.mark.slow
@needs_sandbox
def test_sealed_replay_against_todays_code(tmp_path, capsys):
    db = tmp_path / "s.db"
    rec = record_program(capsys, db, _tree(tmp_path, "work"), "--check", "sh check.sh",
                         program=("python3", "openai_agent.py"))
    assert rec["exit_code"] == 0 and rec["calls"] == 2 and rec["passed"] is True, rec["stderr"]
    run = rec["run_id"]

    # Sealed, the code as recorded: identical, and nothing ran live.
    code, same = _replay(capsys, db, run, "--sealed")
    assert code == 0 and same["identical"] is True and same["sealed"] is True and same["divergence"] is None
    assert same["logits_computed"] == 0 and same["tools_run"] == 0 and same["calls_generated"] == 0

    # Today's code asks the first question otherwise: exit 1, the divergence named to the field;
    # the program got an error for that call (and no model ran, no tool ran).
    today = _tree(tmp_path, "today")
    (today / "openai_agent.py").write_text((EXAMPLES / "openai_agent.py").read_text().replace(
        ASKED, "Which file? Reply with its name only."))
    code, moved = _replay(capsys, db, run, "--sealed", "--code", str(today))
    assert code == 1 and moved["identical"] is False, moved
    d = moved["divergence"]
    assert d["call"] == 0 and d["at"].endswith(":prompt") and d["field"]["path"] == "messages[0].content", d
    assert d["field"]["recorded"].endswith(ASKED) and d["field"]["requested"].endswith("Which file? Reply with its name only.")
    assert moved["logits_computed"] == 0 and moved["tools_run"] == 0 and moved["calls_generated"] == 0
    assert moved["exit_code"] != 0 and moved["same_tree"] is False  # it never wrote greeting.txt

    # Not sealed, the same change: from the divergence on, the model answers live.
    code, live = _replay(capsys, db, run, "--code", str(today))
    assert code == 0 and live["identical"] is False and live["calls_generated"] >= 1, live

    # The program under another name, named after --: the same decisions.
    renamed = _tree(tmp_path, "renamed", "agent.py")
    code, again = _replay(capsys, db, run, "--sealed", "--code", str(renamed), "--", "python3", "agent.py")
    assert code == 0 and again["identical"] is True, again

    # Bad input: one line, exit 2, nothing written.
    base = ["replay", str(run), "--db", str(db)]
    _refused(capsys, db, [*base, "--code", str(tmp_path / "nowhere")], "is not a directory")
    _refused(capsys, db, [*base, "--code", str(renamed)], "holds no openai_agent.py")
    _refused(capsys, db, [*base, "--sealed", "--", "python3", "missing.py"], "missing.py")


@pytest.mark.slow
@needs_sandbox
def test_a_run_recorded_without_the_sdk_is_no_sealed_replay(tmp_path, capsys):
    db = tmp_path / "s.db"
    program = ("from openai import OpenAI\nc = OpenAI()\n"
               "c.chat.completions.create(model='m', max_tokens=2, messages=[{'role': 'user', 'content': 'hi'}])\n")
    rec = record_one_call(capsys, db, program_tree(tmp_path, "tree", program))
    _refused(capsys, db, ["replay", str(rec["run_id"]), "--db", str(db), "--sealed"], "without the SDK")
    assert cli_json(capsys, ["replay", str(rec["run_id"]), "--db", str(db), "--json"])["identical"] is True


def test_the_field_where_two_requests_part():
    a = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "x"}]}
    assert request_field(a, a) is None
    b = {**a, "messages": [a["messages"][0], {"role": "user", "content": "y"}]}
    assert request_field(a, b) == ("messages[1].content", "x", "y")
    assert request_field(a, {**a, "max_tokens": 5}) == ("max_tokens", 4, 5)
    assert request_field(a, {**a, "messages": a["messages"][:1]}) == ("messages[1]", a["messages"][1], None)
    assert request_field(a, {**a, "stop": ["\n"]}) == ("stop", None, ["\n"])


REPEATED = """\
from openai import OpenAI
from tttr.recorders import sdk

@sdk.tool
def topic():
    return "the sea"

client = OpenAI()
ask = dict(model="m", max_tokens=12, temperature=1.5, messages=[{"role": "user", "content": f"A word on {topic()}"}])
print("first:", repr(client.chat.completions.create(**ask).choices[0].message.content))
print("second:", repr(client.chat.completions.create(**ask).choices[0].message.content))
"""


@pytest.mark.slow
@needs_sandbox
def test_repeated_identical_calls_get_their_recorded_answers_in_order(tmp_path, capsys):
    db = tmp_path / "s.db"
    rec = record_program(capsys, db, program_tree(tmp_path, "tree", REPEATED))
    assert rec["exit_code"] == 0 and rec["calls"] == 2, rec["stderr"]
    first, second = (line.split(": ", 1)[1] for line in rec["stdout"].splitlines())
    assert first != second  # one request, two answers (each call draws its own seed)
    code, res = _replay(capsys, db, rec["run_id"], "--sealed")
    assert code == 0 and res["identical"] is True and res["stdout"] == rec["stdout"], res
