"""The debugger's keys on a run recorded for real (the default model, the real sandbox, a
real store), driven by Textual's pilot: `p` on a token shows the prompt text the model read
and the tokens before it, and `e` on the setup step forks at a start-tree file or a variable
through the edit dialog, with the checks and the result of `tttr fork --at setup:...`."""

from __future__ import annotations

import shutil

import pytest

from tests.app_helpers import run_app, wait_for
from tests.sandbox_helpers import needs_sandbox
from tttr.app.screens.ask import AskScreen
from tttr.app.screens.compare import CompareScreen
from tttr.app.screens.edit import EditScreen
from tttr.app.screens.timeline import TimelineScreen
from tttr.app.widgets.detail import DetailPane
from tttr.sessions.store import Store

pytestmark = [needs_sandbox, pytest.mark.slow]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One write-line run, recorded by the default model in the sandbox: (db, run id)."""
    from tttr.engine.replay.runs import record
    from tttr.engine.replay.runtime import Runtime

    path = tmp_path_factory.mktemp("recorded") / "session.db"
    runtime = Runtime(kernel_mode="invariant")
    try:
        with Store.open(path) as store:
            run = record(store, "write-line", runtime=runtime, seed=1, temperature=0.7).run_id
    finally:
        runtime.close()
    return path, run


def _flat(text: str) -> str:
    return "".join(text.split())  # the pane wraps lines: compare without whitespace


def test_p_on_a_token_shows_the_prompt_text_it_read_then_the_tokens_before_it(recorded):
    from tttr.engine.replay.prompts import prompts
    from tttr.engine.replay.runtime import Runtime

    db, run = recorded
    with Store.open(db, create=False, readonly=True) as store:
        prompt = prompts(store, run, Runtime().tokenizer)[0]  # the vocabulary only, not the weights
        tokens = [e.value["text"] for e in store.events(run, 0, None, step=0, kind="token")]
    assert prompt.verified and len(tokens) > 4

    async def flow(app, pilot):
        await wait_for(pilot, lambda: isinstance(app.screen, TimelineScreen))
        screen = app.screen
        detail = screen.query_one(DetailPane)
        screen.timeline.cursor = screen.view.at("0:logits:4").seq  # a logits row works as its token's
        await pilot.pause()
        await pilot.press("p")
        await wait_for(pilot, lambda: "verified" in detail.text, timeout=120)  # the prompt rebuilt in a worker
        assert screen.view.event(screen.timeline.cursor).site == "0:prompt"
        text = detail.text
        assert text.startswith("context of 0:token:4 ")
        assert f"{prompt.n_tokens} prompt tokens, then 4 generated before it" in " ".join(text.split())
        # The end of the prompt the model read, then its four tokens, then the fifth, marked.
        assert _flat(prompt.text[-300:] + "".join(tokens[:5])) in _flat(text)
        return True

    assert run_app(db, flow, run_id=run, load_tokenizer=True)


NEW_README = '"greeting.txt should say hello world, in lower case\\n"'


def test_a_setup_file_fork_from_the_edit_dialog_equals_tttr_fork(recorded, tmp_path, capsys):
    from tttr.app.cli import main
    from tttr.engine.replay.diff import diff_runs

    db = tmp_path / "session.db"
    shutil.copy(recorded[0], db)
    run = recorded[1]

    async def flow(app, pilot):
        await wait_for(pilot, lambda: isinstance(app.screen, TimelineScreen))
        timeline = app.screen.timeline
        assert app.screen.view.event(timeline.cursor).site == "setup:setup"  # the setup step's row
        await pilot.press("e")
        assert isinstance(app.screen, AskScreen)
        ask = app.screen
        ask.query_one("#ask-value").value = "env:LD_PRELOAD"
        await pilot.press("enter")
        edit = app.screen
        assert isinstance(edit, EditScreen) and edit.site == "setup:env:LD_PRELOAD"
        edit.query_one("#edit-value").value = "x.so"
        edit.action_confirm()  # refused as tttr fork refuses it: the dialog stays, with the reason
        await pilot.pause()
        refused = str(edit.query_one("#edit-error").render())
        assert app.screen is edit and "not a variable a run can start with" in refused
        await pilot.press("escape")
        await pilot.press("e")
        app.screen.query_one("#ask-value").value = "file:README"
        await pilot.press("enter")
        edit = app.screen
        assert isinstance(edit, EditScreen) and edit.site == "setup:file:README"
        assert edit.current == '"greeting.txt should say hello world\\n"'  # the start tree's text, as JSON
        edit.query_one("#edit-value").value = NEW_README
        edit.action_confirm()
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), timeout=400)
        return refused, app.screen.run_b

    refused, from_app = run_app(db, flow, run_id=run, load_tokenizer=True)
    capsys.readouterr()
    assert main(["fork", str(run), "--at", "setup:env:LD_PRELOAD", "--set", "x.so", "--db", str(db)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(" ".join(refused.split())), (err, refused)  # the same reason
    assert main(["fork", str(run), "--at", "setup:file:README", "--set", NEW_README, "--db", str(db)]) == 0
    with Store.open(db, create=False, readonly=True) as store:
        runs = {r.id: r for r in store.runs()}
        (from_cli,) = [r for r in runs if r not in (run, from_app)]
        assert runs[from_app].mutation == runs[from_cli].mutation and runs[from_app].parent == run
        assert runs[from_app].mutation["site"] == "setup:file:README"
        same = diff_runs(store, from_app, from_cli)
        assert same.identical, same.to_json()
        setups = [store.event_at(r, "setup:setup").value for r in (from_app, from_cli)]
        assert setups[0]["tree"] == setups[1]["tree"] != store.event_at(run, "setup:setup").value["tree"]
