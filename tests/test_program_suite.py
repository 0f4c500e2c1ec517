"""`tttr suite --tasks-dir DIR --runs N -- PROGRAM` end to end (issue 30): a user's task folder,
a user's program on the official `openai` client, the default model, the real sandbox and a
real SQLite file. The program sees the instruction in its environment and in TTTR_TASK.md
(the task's check says so), the pinned condition replays the anchor and agrees 100% on the
model's answers, token-pinned runs (the anchor's call seeds, the world live) get the anchor's
answers to the same prompts, and `tttr stats` reports agreement on model calls and outcomes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.sandbox_helpers import needs_sandbox
from tttr.sessions.store import Store

pytestmark = [pytest.mark.slow, needs_sandbox]

AGENT = '''
import os
from openai import OpenAI

task = os.environ["TTTR_TASK_INSTRUCTION"]
with open("seen.txt", "w") as f:
    f.write(task + "\\n")
client = OpenAI()
model = client.models.list().data[0].id
r = client.chat.completions.create(model=model, max_tokens=6, temperature=1.0,
                                   messages=[{"role": "user", "content": task}])
with open("answer.txt", "w") as f:
    f.write((r.choices[0].message.content or "-") + "\\n")
'''


def _tttr(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "tttr.app", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=900)  # a hang guard only


def test_a_program_suite_on_a_task_folder(tmp_path):
    tasks = tmp_path / "tasks" / "say-a-word"
    (tasks / "tree").mkdir(parents=True)
    (tasks / "tree" / "notes.txt").write_text("a start tree\n")
    (tasks / "instruction.md").write_text("Say one word about the sea.\n")
    (tasks / "check.sh").write_text("[ -s answer.txt ] && cmp -s seen.txt TTTR_TASK.md && [ -f notes.txt ]\n")
    (tmp_path / "agent.py").write_text(AGENT)
    db = tmp_path / "p.db"
    out = _tttr("suite", "--tasks-dir", str(tmp_path / "tasks"), "--runs", "2", "--db", str(db), "--label", "mine",
                "--", "python3", "agent.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "[8/8]" in out.stderr and "model call(s)" in out.stderr

    with Store.open(db, readonly=True, create=False) as store:
        runs = store.runs()
        assert len(runs) == 8 and all(r.status == "complete" for r in runs)
        assert all(r.meta["suite"]["task"] == "say-a-word" and r.task == "program:python3" for r in runs)
        assert all(r.outcome["passed"] is True for r in runs)  # the instruction reached the program both ways
        by = {c: [r for r in runs if r.meta["suite"]["condition"] == c]
              for c in ("free", "token-pinned", "trace-pinned", "pinned")}
        anchor = by["free"][0]
        assert all(r.parent == anchor.id for r in by["pinned"])
        assert all(r.seed == anchor.seed and r.meta["clock"] == anchor.meta["clock"] for r in by["trace-pinned"])

        def calls(run):  # each model call's seed and answer
            prompts = [e.value["sampling"]["seed"] for e in store.events(run.id, kind="prompt")]
            return list(zip(prompts, [e.value["text"] for e in store.events(run.id, kind="message")]))

        assert len(by["token-pinned"]) == 2 and calls(anchor)
        for run in by["token-pinned"]:  # the prompt does not depend on the world: the anchor's answer, recomputed
            assert run.seed == anchor.seed and run.parent is None and calls(run) == calls(anchor)
        assert calls(by["free"][1])[0][0] != calls(anchor)[0][0]  # a free run's call seed is drawn afresh

    out = _tttr("stats", "--db", str(db), "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    pinned = data["tasks"][0]["conditions"]["pinned"]
    assert pinned["model_call_agreement"] == 1.0 and pinned["agreement"] == 1.0 and data["residual_ok"]
    assert data["tasks"][0]["conditions"]["free"]["outcome_agreement"] == 1.0
    assert data["tasks"][0]["conditions"]["token-pinned"]["model_call_agreement"] == 1.0


def test_a_program_that_is_not_there_is_one_line_and_writes_nothing(tmp_path):
    tasks = tmp_path / "t"
    tasks.mkdir()
    (tasks / "instruction.md").write_text("x\n")
    (tasks / "check.sh").write_text("true\n")
    db = tmp_path / "p.db"
    out = _tttr("suite", "--tasks-dir", str(tasks), "--runs", "2", "--db", str(db), "--", "no-such-agent", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not found" in out.stderr, out.stderr
    assert not db.exists()
