"""What the tests of recorded programs share (test_program_record, _replay, _fork, _triage,
test_examples): a `tttr` command run in-process for its `--json` answer, and a program
recorded as a user records it."""

from __future__ import annotations

import json
from pathlib import Path

from tttr.app.cli import main

CLOCK = "2026-03-02T10:00:00"


def cli_json(capsys, argv: list[str]) -> dict:
    """`tttr ARGV` in this process: it exits 0, and its last line of output is the JSON answer."""
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out.strip().splitlines()[-1])


def program_tree(tmp_path: Path, name: str, source: str) -> Path:
    """A start tree `tmp_path/name` holding the program `prog.py`."""
    tree = tmp_path / name
    tree.mkdir()
    (tree / "prog.py").write_text(source)
    return tree


def record_program(capsys, db: Path, tree: Path, *extra: str, program=("python3", "prog.py")) -> dict:
    """`tttr record --seed 7 --clock CLOCK --json EXTRA -- PROGRAM` of `tree` into `db`: its answer."""
    return cli_json(capsys, ["record", "--db", str(db), "--tree", str(tree), "--seed", "7", "--clock", CLOCK,
                             "--json", *extra, "--", *program])


def record_one_call(capsys, db: Path, tree: Path, *extra: str) -> dict:
    """`record_program` of a program that exits 0 after exactly one model call: its answer."""
    rec = record_program(capsys, db, tree, *extra)
    assert rec["exit_code"] == 0 and rec["calls"] == 1, rec["stderr"]
    return rec


def replay_json(capsys, db: Path, run_id: int, *more: str) -> dict:
    """`tttr replay RUN --db DB --json [MORE...]` in this process: its answer."""
    return cli_json(capsys, ["replay", str(run_id), "--db", str(db), "--json", *more])
