"""Triage of a planted single-token flip on a task whose commands interleave stderr (issue 27):
GOOD and BAD differ by one token, so GOOD's token alone must fix BAD. The token layer's replay
needs commands BAD never ran; run live, a pipeline whose two processes both write stderr
(`ls missing | cat -w -`) interleaves its error lines by scheduling, the next prompt differs,
and triage would wrongly say "needs more than one layer". The world answers the same
question the same way: those commands are answered from GOOD's recording of them in the
same state (`reused_from`), and nothing runs live."""

from __future__ import annotations

import json

import pytest

from tttr.app.cli import main
from tttr.engine.replay.agent import AgentLimits
from tttr.engine.replay.runs import fork, record
from tttr.engine.replay.runtime import Runtime
from tttr.sessions.store import Store

INSTRUCTION = ("Run `ls missing | cat nofile` to see both errors, then write the line `done` into a new file "
               "named `done.txt`.\n")
SEED = 3  # the default model's first command is `ls missing | cat -w -`: both sides of the pipe write stderr


@pytest.fixture
def pipe_task(tmp_path, monkeypatch):
    task = tmp_path / "tasks" / "pipe-errors"
    task.mkdir(parents=True)
    (task / "instruction.md").write_text(INSTRUCTION)
    (task / "check.sh").write_text('[ "$(cat /work/done.txt 2>/dev/null)" = "done" ] || exit 1\n')
    (task / "setup.sh").write_text('echo "write done into done.txt" > README\n')
    (task / "task.json").write_text('{"clock": "2026-03-02T09:05:00", "difficulty": "easy", "tags": ["files"]}\n')
    monkeypatch.setenv("TTTR_TASKS_PATH", str(tmp_path / "tasks"))
    return "pipe-errors"


@pytest.mark.slow  # records and forks real runs of the default model
def test_triage_of_a_planted_token_flip_names_the_token_layer_and_reuses_the_world(tmp_path, pipe_task, capsys):
    db = tmp_path / "s.db"
    runtime = Runtime(kernel_mode="invariant")
    try:
        with Store.open(db, create=True) as store:
            good = record(store, pipe_task, runtime=runtime, seed=SEED, limits=AgentLimits(max_steps=3))
            first = good.actions[0]
            assert "|" in first and first.startswith("ls missing"), good.actions
            bad = fork(store, good.run_id, "0:token:0", "echo", runtime=runtime)  # the planted flip
            assert bad.actions[0] != first, bad.actions
    finally:
        runtime.close()

    assert main(["triage", str(good.run_id), str(bad.run_id), "--db", str(db), "--judge", "actions", "--json"]) == 0
    t = json.loads(capsys.readouterr().out)
    assert t["culprits"] == ["token"], t["verdict"]
    layers = {r["layer"]: r for r in t["layers"]}
    assert [d["site"] for d in layers["token"]["deltas"]] == ["0:token:0"]
    assert layers["trace"]["fixed"] is None and layers["tensor"]["fixed"] is None  # no delta: not replayed
    replay = layers["token"]["replay"]
    assert replay["actions"] == good.actions and replay["failed"] is False
    with Store.open(db, readonly=True) as store:
        _, events = store.load_run(replay["run_id"])
        tools = [e for e in events if e.kind == "tool" and e.step >= 0]
        good_stderr = {e.site: e.value["stderr"] for e in store.events(good.run_id, kind="tool")}
    # Every command of GOOD's path that BAD never ran is GOOD's recorded answer, not a live re-run.
    assert len(tools) == len(good.actions)
    for e in tools:
        assert e.value.get("reused_from") == {"run": good.run_id, "site": e.site}, (e.site, e.value.get("reused_from"))
        assert e.value["stderr"] == good_stderr[e.site]
