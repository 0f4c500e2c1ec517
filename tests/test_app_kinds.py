"""The app forks as the run's kind forks (issue 28): its fork worker (app/forking.py) asks
`kind_of(run)` for the check and the fork, as `tttr fork` does, so a served-call run forks
from the timeline as it forks from the command line, and a run the app cannot fork (an
imported trace: it needs your program) is refused in the kind's one line, nothing written.
The served-call run is real: calls made with the official `openai` client against a real
`tttr serve --db` on the default model."""

from __future__ import annotations

import threading

import pytest

from tests.app_helpers import open_store, run_app, wait_for
from tttr.app.screens.compare import CompareScreen
from tttr.app.screens.edit import EditScreen
from tttr.app.widgets.timeline import Timeline
from tttr.sessions.store import Store


def test_the_fork_worker_refuses_an_imported_trace_in_its_kinds_line_and_writes_nothing(tmp_path, capsys):
    from test_traces_against import _import, _shop_trace
    from tttr.app.forking import run_fork
    from tttr.engine.replay.runtime import Runtime
    from tttr.sessions.errors import TTTRError

    db = tmp_path / "imported.db"
    run = _import(capsys, _shop_trace(tmp_path), db)
    before = db.read_bytes()
    said = []
    with pytest.raises(TTTRError) as refused:
        run_fork(db, run, "1:tool", '"3 pears"', runtime=Runtime(), unsafe_no_sandbox=False,
                 progress=lambda *report: said.append(report), cancel=threading.Event())
    # The imported kind's own refusal (what `tttr fork` says), not the agent's "recorded with model …"
    assert "is an imported trace: it holds no program" in str(refused.value) and "\n" not in str(refused.value)
    assert said == [] and db.read_bytes() == before


def test_the_edit_dialogs_check_is_the_runs_kinds_and_names_what_is_wrong(tmp_path):
    """The timeline's dialog asks the run's kind to check a typed value (`kind.check_value`), as
    the fork will: a clock of an agent run parses as `tttr fork --set` takes it, a token of a run
    recorded with another model names the model to start the app with, a site that is no value
    says which are."""
    from tttr.engine.kinds import AGENT, kind_of
    from tttr.engine.replay.runtime import Runtime

    db = tmp_path / "agent.db"
    with Store.open(db) as store:
        rid = store.begin_run(task="write-line", model_id="another-model", kernel_mode="invariant", seed=1, meta={})
        store.append(rid, "0:clock", {"t": "2026-03-02T09:00:00"})
        store.commit_step(rid)
        store.finish_run(rid, "complete", {"passed": False})
    runtime = Runtime()
    with Store.open(db, readonly=True) as store:
        run = store.run(rid)
        assert kind_of(run) is AGENT
        assert AGENT.check_value(store, run, "0:clock", "+1h", runtime) is None
        for site, value, why in (("0:clock", "soon", "soon"), ("0:token:0", "id:3", "which is not the model at hand"),
                                 ("0:prompt", "x", "cannot be edited")):
            with pytest.raises(Exception) as refused:
                AGENT.check_value(store, run, site, value, runtime)
            assert why in str(refused.value) and "\n" not in str(refused.value)
        assert getattr(refused.value, "exit_code", None) == 2

    async def flow(app, pilot):  # the dialog's check is the kind's, its line shown as is
        screen = app.screen
        assert screen.validate_edit("0:clock", "+1h") is None
        assert "which is not the model at hand" in screen.validate_edit("0:token:0", "id:3")

    run_app(db, flow, run_id=rid, load_tokenizer=False)


@pytest.fixture(scope="module")
def served_db(tmp_path_factory):
    """One chat call recorded by a real `tttr serve --db` on the default model."""
    import openai

    from serve_helpers import recording_server

    db = tmp_path_factory.mktemp("served") / "served.db"
    server = recording_server(db)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        client.chat.completions.create(messages=[{"role": "user", "content": "Name a colour."}], max_tokens=6,
                                       temperature=0.8, seed=11, model=server.service.model_id)
    finally:
        server.stop()
        server.recorder.close()
        server.service.close()
    with Store.open(db, readonly=True) as store:
        (run,) = store.runs()
    return db, run.id


@pytest.mark.slow
def test_a_served_call_run_forks_from_the_timeline_as_tttr_fork_forks_it(served_db, capsys):
    from tttr.app.cli import main
    from tttr.engine.kinds import CALLS, kind_of

    db, run_id = served_db

    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        timeline.cursor = timeline.view.at("0:token:1").seq
        await pilot.pause()
        await pilot.press("e")
        assert isinstance(app.screen, EditScreen)
        await pilot.press("down", "enter")  # the second recorded alternative
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen), timeout=600)
        forks = [r for r in app.store.runs() if r.parent == run_id]
        assert len(forks) == 1
        return forks[0].id

    child = run_app(db, flow, run_id=run_id)
    store = open_store(db)
    try:
        made = store.run(child)
        assert made.status == "complete" and made.fork_site == "0:token:1" and kind_of(made) is CALLS
        value = made.mutation["input"]
    finally:
        store.close()
    # The same fork from the command line (the CALLS kind's, on its own runtime): the same run.
    capsys.readouterr()
    assert main(["fork", str(run_id), "--db", str(db), "--at", "0:token:1", "--set", value]) == 0, capsys.readouterr()
    store = open_store(db)
    try:
        by_cli = max(r.id for r in store.runs())
        assert by_cli != child

        def values(rid):
            return [(e.site, e.value) for e in store.events(rid) if e.kind in ("token", "logits", "message")]

        assert values(child) == values(by_cli) and values(child)
        assert store.run(by_cli).mutation == made.mutation
    finally:
        store.close()
