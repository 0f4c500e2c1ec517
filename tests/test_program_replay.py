"""`tttr replay RUN` of a recorded program: re-run in the sandbox on the restored start
tree, its model calls, SDK tool calls and clock reads answered from the recording (no model,
no tool run); an edited program diverges at the first request that differs."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from tttr.app.cli import main
from tttr.recorders.snapshot import read_manifest
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import program_tree, record_one_call, replay_json

PROGRAM = textwrap.dedent("""\
    from openai import OpenAI
    from tttr.recorders import sdk

    @sdk.tool
    def note(text):
        with open("log.txt", "a") as f:
            f.write(text + "\\n")
        return len(text)

    client = OpenAI()
    r = client.chat.completions.create(model=client.models.list().data[0].id, messages=[{"role": "user", "content": "Say hi"}],
                                       max_tokens=4, seed=3)
    answer = r.choices[0].message.content
    print(repr(answer), note(answer), sdk.now().isoformat())
""")


def _record(capsys, tmp_path: Path) -> tuple[Path, Path, dict]:
    tree, db = program_tree(tmp_path, "tree", PROGRAM), tmp_path / "s.db"
    return db, tree, record_one_call(capsys, db, tree)


@pytest.mark.slow
@needs_sandbox
def test_faithful_replay_is_identical_without_model_or_tools(tmp_path, capsys):
    db, tree, rec = _record(capsys, tmp_path)
    assert not (tree / "log.txt").exists()  # recorded in a copy of the tree
    res = replay_json(capsys, db, rec["run_id"])
    assert res["identical"] is True and res["divergence"] is None, res
    assert res["stdout"] == rec["stdout"] and res["exit_code"] == 0
    assert res["logits_computed"] == 0 and res["tools_run"] == 0 and res["calls_answered"] == 3
    assert res["calls_generated"] == 0
    with Store.open(db, readonly=True) as store:
        run, events = store.load_run(res["run_id"])
        assert run.parent == rec["run_id"] and run.status == "complete"
        kinds = [(e.step, e.kind) for e in events]
        assert (0, "prompt") in kinds and (1, "tool") in kinds and (2, "clock") in kinds, kinds
        assert kinds[:2] == [(-1, "clock"), (-1, "setup")]  # the setup clock, as recorded
        end = next(e.value for e in events if e.kind == "tool" and "program" in e.value)
        paths = {e.path for e in read_manifest(end["snapshot"], store)}
        assert "log.txt" in paths  # the tool was answered from the recording, never run; its write put back
    assert res["same_tree"] is True
    assert not (tree / "log.txt").exists()  # the user's tree is left alone
    assert main(["diff", str(rec["run_id"]), str(res["run_id"]), "--db", str(db), "--json"]) == 0
    diff = json.loads(capsys.readouterr().out)
    assert diff["identical"] is True and len(diff["rows"]) == 4, diff  # call, tool, clock, the program's end


@pytest.mark.slow
@needs_sandbox
def test_edited_program_given_with_code_diverges_at_its_first_call(tmp_path, capsys):
    db, tree, rec = _record(capsys, tmp_path)
    # The recorded folder is not where a replay looks: editing it changes nothing.
    (tree / "prog.py").write_text(PROGRAM.replace("Say hi", "Say bye"))
    assert replay_json(capsys, db, rec["run_id"])["identical"] is True
    code = tmp_path / "today"
    code.mkdir()
    (code / "prog.py").write_text(PROGRAM.replace("Say hi", "Say bye"))
    res = replay_json(capsys, db, rec["run_id"], "--code", str(code))
    div = res["divergence"]
    assert res["identical"] is False and div["site"].startswith("call 0 (step 0), message 0"), res
    assert div["recorded"]["content"] == "Say hi" and div["live"]["content"] == "Say bye"
    # From the divergence on the program runs on: its call is generated live, by the recorded model.
    assert res["exit_code"] == 0 and res["calls_generated"] == 1 and res["logits_computed"] > 0, res
    extra = PROGRAM + "client.chat.completions.create(model=r.model, messages=[{'role': 'user', 'content': 'More'}], max_tokens=2)\n"
    (code / "prog.py").write_text(extra)  # a call the recording lacks, after all it holds
    res = replay_json(capsys, db, rec["run_id"], "--code", str(code))
    div = res["divergence"]
    assert div["site"] == "step 3" and div["recorded"] == "(the recording ends here)", res
    assert div["live"].startswith("call 1: ") and "More" in div["live"]
    assert res["exit_code"] == 0 and res["calls_generated"] == 1 and res["stdout"] == rec["stdout"], res
    with Store.open(db, readonly=True) as store:
        runs = len(store.runs())
        setup = next(e.value for e in store.events(res["run_id"], kind="setup"))
        assert setup["snapshot"] != rec_setup(store, rec["run_id"])["snapshot"]  # the tree it ran from, recorded
    assert main(["fork", str(rec["run_id"]), "--db", str(db), "--at", "0:prompt", "--set", "3"]) == 2
    assert "STEP:tool" in capsys.readouterr().err
    assert main(["replay", str(rec["run_id"]), "--db", str(db), "--code", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "not a directory" in err and len(err.strip().splitlines()) == 1, err
    with Store.open(db, readonly=True) as store:
        assert len(store.runs()) == runs  # nothing written


def rec_setup(store, run_id: int) -> dict:
    return next(e.value for e in store.events(run_id, kind="setup"))


STREAMING = textwrap.dedent("""\
    from openai import OpenAI

    client = OpenAI()
    stream = client.chat.completions.create(model="gpt-4o-mini", stream=True, max_tokens=12, temperature=0,
                                            messages=[{"role": "user", "content": "Count to five."}])
    for chunk in stream:  # a program that shows each piece as it comes
        if chunk.choices:
            print(repr(chunk.choices[0].delta.content))
""")


@pytest.mark.slow
@needs_sandbox
def test_a_streamed_call_replays_in_the_pieces_it_was_sent_in(tmp_path, capsys):
    db = tmp_path / "stream.db"
    rec = record_one_call(capsys, db, program_tree(tmp_path, "work", STREAMING))
    shown = rec["stdout"].splitlines()
    assert len([line for line in shown if line not in ("''", "None")]) >= 3, shown  # several pieces
    res = replay_json(capsys, db, rec["run_id"])
    assert res["identical"] is True and res["stdout"] == rec["stdout"], (res["stdout"], rec["stdout"])
    assert res["logits_computed"] == 0
