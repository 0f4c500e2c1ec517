"""assets/examples/: each example agent solves the task suite's `write-line` task under
`tttr record` (the task's check passes), `tttr replay` of its run is identical with no
model computation and no tool run, and a fork at its `list_files` result (the file is there
already) takes the other path: it stops without writing, and `tttr diff` shows where the runs part."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tttr.recorders.treestate import file_text, tree_at
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import cli_json, replay_json
from tests.test_logical_clock import busy_cores

ROOT = Path(__file__).resolve().parent.parent
TASK = ROOT / "assets" / "tasks" / "write-line"


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("example", ["openai_agent.py", "langgraph_agent.py", "agents_sdk_agent.py"])
def test_example_solves_write_line_replays_faithfully_and_forks(tmp_path, capsys, example):
    tree = tmp_path / "work"
    tree.mkdir()
    subprocess.run(["sh", str(TASK / "setup.sh")], cwd=tree, check=True)
    shutil.copy(ROOT / "assets" / "examples" / example, tree)
    shutil.copy(TASK / "check.sh", tree)
    db = tmp_path / "agent.db"
    clock = json.loads((TASK / "task.json").read_text())["clock"]
    rec = cli_json(capsys, ["record", "--db", str(db), "--tree", str(tree), "--seed", "1", "--clock", clock,
                            "--check", "sh check.sh", "--json", "--", "python3", example])
    assert rec["exit_code"] == 0 and rec["passed"] is True and rec["calls"] == 2, rec["stderr"]
    assert "greeting.txt: 'hello world' (exit 0)" in rec["stdout"] and "[2026-03-02 09:05]" in rec["stdout"]
    with Store.open(db, readonly=True) as store:
        assert file_text(store, tree_at(store, rec["run_id"]).files["greeting.txt"]).text == "hello world\n"
        kinds = [e.kind if e.value.get("source") != "program" else "program clock"  # a call's S:clock (issue 27)
                 for e in store.load_run(rec["run_id"])[1]]
    assert kinds.count("message") == 2 and kinds.count("clock") == 2 and kinds.count("tool") == 4, kinds  # setup:clock

    with busy_cores():  # replays hold on a busy machine: the program's clock moves by its reads, not real time
        res = replay_json(capsys, db, rec["run_id"])
    assert res["identical"] is True and res["divergence"] is None, res
    assert res["stdout"] == rec["stdout"] and res["exit_code"] == 0
    assert res["logits_computed"] == 0 and res["tools_run"] == 0 and res["calls_answered"] == 6

    fork = cli_json(capsys, ["fork", str(rec["run_id"]), "--db", str(db), "--at", "1:tool",
                             "--set", '["README", "greeting.txt"]', "--json"])
    assert fork["fork_site"] == "1:tool" and fork["exit_code"] == 1, fork
    assert "greeting.txt exists already: not overwriting it" in fork["stdout"]
    assert fork["calls_generated"] == 0 and fork["logits_computed"] == 0 and fork["tools_run"] == 0
    diff = cli_json(capsys, ["diff", str(rec["run_id"]), str(fork["run_id"]), "--db", str(db), "--json"])
    rows = diff["rows"]  # one per step: the first call's message, then the list_files call with its result
    assert diff["identical"] is False and rows[0]["same"] and not rows[1]["same"], diff
    assert rows[1]["a_action"].startswith("list_files(") and "greeting.txt" in rows[1]["b_action"], rows[1]
    assert diff["first_divergence"]["trace"]["site"] == "1:tool", diff
