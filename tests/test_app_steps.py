"""The timeline as a step tree (issue 29), driven by Textual's pilot on databases written
through the real store: one row per step that says what the step did, a step expanded to its
tokens and logits and collapsed again, every step at once, the filter by layer and kind, the
position on the last event, and search over every kind of event (outcomes and prompts too)."""

from __future__ import annotations

import pytest
from tttr.app.screens.ask import AskScreen
from tttr.app.screens.search import SearchScreen
from tttr.app.search import build_corpus, search
from tttr.app.runview import RunView
from tttr.app.steps import EventFilter, StepRows, parse_filter
from tttr.app.widgets.detail import DetailPane
from tttr.app.widgets.timeline import Timeline

from tests.app_helpers import open_store, two_runs, wait_for
from tests.app_helpers import run_app as _run_app

TOKENS = 6
STEPS = 5
PER_STEP = 2 * TOKENS + 5


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    return two_runs(tmp_path_factory.mktemp("steps") / "session.db", STEPS, TOKENS)


@pytest.fixture(scope="module")
def failed_db(tmp_path_factory):
    """One short run that fails its check, written through the store as the agent loop writes it."""
    from tttr.sessions.store import Store

    path = tmp_path_factory.mktemp("failed") / "failed.db"
    store = Store.open(path, create=True)
    run = store.begin_run(task="write-line", model_id="m", kernel_mode="invariant", seed=1)
    store.append(run, "setup:clock", {"t": "2026-01-01T10:00:00"})
    store.append(run, "setup:setup", {"task": "write-line", "clock": "2026-01-01T10:00:00",
                                                             "tree": "ab" * 32, "snapshot": None})
    store.commit_step(run)
    store.append(run, "0:prompt", {"ids_digest": "cd" * 8, "n_tokens": 12})
    store.append(run, "0:token:0", {"id": 93, "text": " goodbye", "forced": False,
                                                          "logprob": -0.5, "rng": [1, 0, 0]})
    store.append(run, "0:logits:0", {"digest": "ef" * 8, "topk": [[93, -0.5], [5167, -1.2]],
                                                             "batch": [1, [0]], "mode": "invariant"})
    store.append(run, "0:message", {"text": "echo goodbye > greet.txt"})
    store.append(run, "0:action", {"cmd": "echo goodbye > greet.txt"})
    store.append(run, "0:clock", {"t": "2026-01-01T10:00:03"})
    store.append(run, "0:tool", {"cmd": "echo goodbye > greet.txt", "stdout": "", "stderr": "",
                                                     "exit_code": 0, "duration_ms": 4})
    outcome = {"passed": False, "checker_exit": 1, "checker_output": "no file greeting.txt"}
    store.append(run, "0:outcome", outcome)
    store.commit_step(run)
    store.finish_run(run, "complete", outcome)
    store.close()
    return path


def run_app(db, flow, *, run_id=1, size=(120, 32)):
    return _run_app(db, flow, run_id=run_id, load_tokenizer=False, size=size)


def lines(timeline: Timeline) -> list[str]:
    return [timeline.render_line(y).text.rstrip() for y in range(timeline.size.height)]


def test_the_rows_model_maps_rows_to_events_and_back(db):
    store = open_store(db)
    try:
        view = RunView(store, 1)
        rows = StepRows(view)
        assert rows.steps == [-1, *range(STEPS)] and rows.count == STEPS + 1 and not rows.flat
        assert [rows.row(i).collapsed for i in range(rows.count)] == [True] * rows.count
        assert view.event(rows.row(2).seq).site == "1:tool"  # a collapsed step stands on what it did
        rows.expand(rows.starts[2])  # step 1
        assert rows.count == STEPS + PER_STEP
        assert [rows.row(2 + k).seq for k in range(PER_STEP)] == list(range(rows.starts[2], rows.ends[2]))
        assert all(rows.row_of(seq) == 2 + k for k, seq in enumerate(range(rows.starts[2], rows.ends[2])))
        assert rows.row_of(rows.starts[3] + 4) == 2 + PER_STEP  # inside a collapsed step: its row
        rows.set_filter(parse_filter("trace"))
        assert [view.event(rows.row(2 + k).seq).site for k in range(2)] == ["1:clock", "1:tool"]
        assert rows.count == STEPS + 2 and not rows.shown(rows.starts[2])  # the prompt is filtered out
        rows.set_filter(parse_filter("-logits -token"))
        assert {view.event(s).kind for s in rows.visible(2)} == {"prompt", "message", "action", "clock", "tool"}
        rows.expand_all()
        assert rows.all_expanded and rows.count == sum(len(rows.visible(i)) for i in range(len(rows.steps)))
        rows.set_filter(EventFilter())
        assert rows.count == view.count  # every step open, nothing filtered: one row per event
    finally:
        store.close()


def test_a_filter_names_layers_and_kinds_or_is_refused():
    assert parse_filter("trace tool") == EventFilter(frozenset({"trace", "tool"}))
    assert parse_filter("-logits") == EventFilter(hide=frozenset({"logits"}))
    assert not parse_filter("  ").active
    with pytest.raises(ValueError, match="'tokens' is neither a layer nor a kind"):
        parse_filter("tokens")


def test_the_timeline_opens_on_one_row_per_step_and_expands_a_step(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        view = timeline.view
        shown = lines(timeline)
        assert shown[0].startswith("setup▸") and shown[1].lstrip().startswith("0▸")
        assert "$ ls -la /var/log → exit 0" in shown[1] and "⏱ 2026-11-29 10:00:03" in shown[1]
        assert "passed (checker exit 0)" in shown[STEPS]  # the last step's outcome on its row
        assert not shown[STEPS + 1].strip()
        await pilot.press("down", "down")  # step 1's row: its command's detail under a line saying so
        assert view.event(timeline.cursor).site == "1:tool" and timeline.on_step_row
        detail = app.screen.query_one(DetailPane).text
        assert f"step 1: {PER_STEP} events" in detail and "exit code" in detail
        await pilot.press("space")  # expanded: one row per event, tokens and logits included
        assert view.event(timeline.cursor).site == "1:prompt" and not timeline.on_step_row
        assert timeline.virtual_size.height == STEPS + PER_STEP
        sites = [view.event(timeline.rows.row(2 + k).seq).site for k in range(PER_STEP)]
        assert "1:token:0" in sites and "1:logits:5" in sites
        assert "1▾" in lines(timeline)[2]
        await pilot.press("down", "down")
        assert view.event(timeline.cursor).site == "1:logits:0"
        await pilot.press("space")  # collapsed again, the cursor on the step's row
        assert timeline.on_step_row and timeline.virtual_size.height == STEPS + 1
        await pilot.press("right")
        assert view.event(timeline.cursor).site == "2:tool"
        await pilot.press("z")  # every step
        assert timeline.virtual_size.height == view.count
        await pilot.press("end")
        assert timeline.cursor == view.count - 1
        assert timeline.border_subtitle == f"event {view.count - 1}/{view.count - 1} · step {STEPS - 1}/{STEPS - 1}"
        await pilot.press("z")
        assert timeline.virtual_size.height == STEPS + 1 and timeline.on_step_row

    run_app(db, flow)


def test_going_to_an_event_inside_a_collapsed_step_expands_it(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        view = timeline.view
        await pilot.press("colon", *"3:token:2", "enter")
        assert view.event(timeline.cursor).site == "3:token:2" and not timeline.on_step_row
        assert timeline.rows.is_expanded(timeline.cursor) and not timeline.rows.is_expanded(view.at("2:tool").seq)
        await pilot.press("colon", *"s2", "enter")  # a step: its row, nothing more expanded
        assert timeline.on_step_row and view.event(timeline.cursor).step == 2
        assert timeline.virtual_size.height == STEPS + 1 + PER_STEP - 1

    run_app(db, flow)


def test_f_filters_the_expanded_steps_and_going_to_a_hidden_event_drops_the_filter(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        view = timeline.view
        await pilot.press("f")
        assert isinstance(app.screen, AskScreen)
        await pilot.press(*"tokens", "enter")  # not a layer or a kind: refused, the dialog stays
        assert isinstance(app.screen, AskScreen) and "neither a layer nor a kind" in app.screen.error
        app.screen.query_one("#ask-value").value = "trace"
        await pilot.press("enter", "z")
        assert timeline.virtual_size.height == 2 + 2 * STEPS  # setup's clock and setup, each step's clock and tool
        assert {view.event(timeline.rows.row(r).seq).layer for r in range(timeline.rows.count)} == {"trace"}
        await pilot.press("colon", *"2:token:1", "enter")  # hidden by the filter: it goes, and says so
        assert view.event(timeline.cursor).site == "2:token:1" and not timeline.rows.filter.active
        assert any("filter off" in str(n.message) for n in app._notifications)

    run_app(db, flow)


def test_search_covers_outcomes_and_every_kind(failed_db):
    store = open_store(failed_db)
    try:
        corpus = build_corpus(RunView(store, 1))
    finally:
        store.close()
    whats = {e.what for e in corpus}
    assert {"prompt", "message", "clock", "setup", "command", "outcome"} <= whats
    hits = search(corpus, "no file")
    assert hits and hits[0].entry.what == "outcome" and "no file greeting.txt" in hits[0].entry.text

    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        await pilot.press("slash")
        dialog = app.screen
        assert isinstance(dialog, SearchScreen)
        await wait_for(pilot, lambda: dialog.corpus is not None)
        await pilot.press(*"no file", "enter")
        assert timeline.view.event(timeline.cursor).kind == "outcome"
        assert "no file greeting.txt" in app.screen.query_one(DetailPane).text

    run_app(failed_db, flow)


def test_t_shows_each_steps_tokens_and_command_time_and_says_what_is_not_recorded(db):
    from tttr.app.screens.timing import TimingScreen
    from tttr.app.steps import TIMING_LACKS, step_timings

    store = open_store(db)
    try:
        timings = step_timings(store, 1)
        view = RunView(store, 1)
        durations = [view.at(f"{s}:tool").value["duration_ms"] for s in range(STEPS)]
    finally:
        store.close()
    assert [t.step for t in timings] == [-1, *range(STEPS)]
    assert [t.tokens for t in timings] == [0] + [TOKENS] * STEPS
    assert [t.tool_ms for t in timings] == [None, *durations]

    async def flow(app, pilot):
        await pilot.press("t")
        screen = app.screen
        assert isinstance(screen, TimingScreen)
        await wait_for(pilot, lambda: screen.timings is not None)
        shown = str(screen.query_one("#timing").render())
        assert "ls -la /var/log" in shown and f"{durations[0]:.1f}" in shown
        assert str(screen.query_one("#timing-note").render()) == TIMING_LACKS
        await pilot.press("escape")
        assert not isinstance(app.screen, TimingScreen)

    run_app(db, flow)


def test_going_to_an_event_far_below_scrolls_to_it_once_its_step_opened(tmp_path):
    path = two_runs(tmp_path / "long.db", 40, TOKENS)

    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        for site in ("3:token:1", "20:token:4", "39:clock"):
            timeline.cursor = timeline.view.at(site).seq
            await pilot.pause()
            top, row = timeline.scroll_offset.y, timeline.rows.row_of(timeline.cursor)
            assert top <= row < top + timeline.scrollable_content_region.height, site
            assert site in "\n".join(lines(timeline))

    run_app(path, flow, size=(100, 24))


def test_bench_app_reports_the_step_tree_and_blame_beside_its_old_figures():
    from tttr.app.bench import measure

    figures = measure(2_000, size=(100, 30), compare=False, runs=0, blame=30)
    for key in ("events", "open_s", "keypress_ms", "keys", "steps", "step_keypress_ms", "blame_first_ms",
                "blame_last_ms", "generate_s", "timing_open_s", "timing_keypress_ms"):
        assert key in figures, key
    assert figures["steps"] >= 2 and figures["blame_writes"] == 30


def test_p_on_a_token_goes_to_its_prompt_and_shows_the_context_it_was_conditioned_on(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        detail = app.screen.query_one(DetailPane)
        view = timeline.view
        await pilot.press("colon", *"2:logits:3", "enter")
        tokens = [view.at(f"2:token:{p}").value["text"] for p in range(4)]
        await pilot.press("p")
        await pilot.pause()
        assert view.event(timeline.cursor).site == "2:prompt"
        text = " ".join(detail.text.split())
        assert text.startswith("context of 2:token:3 ") and f"({view.at('2:token:3').value['id']})" in text
        assert f"{view.at('2:prompt').value['n_tokens']} prompt tokens, then 3 generated before it" in text and "not rebuilt" in text
        # the tokens before it, in order, then the token itself (no tokenizer: the prompt's text is not shown)
        assert "".join("".join(tokens).split()) in "".join(text.split())
        await pilot.press("down")  # off the prompt: the context goes with it
        await pilot.pause()
        assert not detail.text.startswith("context of")
        await pilot.press("colon", *"2:tool", "enter", "p")  # not a token: said, nothing moves
        await pilot.pause()
        assert view.event(timeline.cursor).site == "2:tool"
        assert any("p works on a token" in str(n.message) for n in app._notifications)

    run_app(db, flow)


def test_a_tokens_context_shows_recorded_text_as_text_never_as_markup_or_controls():
    from tttr.app.navigation import CONTEXT_CHARS, token_context
    from tttr.engine.replay.prompts import Prompt
    from tttr.sessions.records import Event

    def token(pos: int, text: str) -> Event:
        return Event(1, 10 + pos, 0, "token", "token", f"0:token:{pos}",
                     {"id": 100 + pos, "text": text, "forced": False, "logprob": -0.1, "rng": [1, 0, pos]})

    prompt_event = Event(1, 9, 0, "agent", "prompt", "0:prompt", {"ids_digest": "ab" * 8, "n_tokens": 7})
    tokens = [token(0, "[bold]x[/]"), token(1, "\x1b]0;pwned\x07"), token(2, " ok")]
    prompt = "z" * 3000 + "task: \x1b[2J[red]y\n"
    text = token_context(prompt_event, Prompt(0, prompt, 7, True), tokens, 2)
    shown = text.plain  # what the pane lays out: a Text, so no markup is ever parsed
    assert "\x1b" not in shown and "\x07" not in shown and "\\x1b]0;pwned\\x07" in shown and "\\x1b[2J" in shown
    assert "[bold]x[/]" in shown and "[red]y" in shown  # recorded brackets read as they are
    assert shown.startswith('context of 0:token:2 " ok" (102)') and "7 prompt tokens, then 2 generated" in shown
    elided = len(prompt) - CONTEXT_CHARS  # the prompt's end is shown, its start elided
    assert f"({elided:,} characters before)\n" + "z" * (3000 - elided) + "task" in shown
