"""The app shows the state a run was in: the prompt the model read at a step, as text;
the setup step of two runs side by side (a fork of the setup clock); and, coming back
from the compare screen, a timeline scrolled to its cursor. Databases are written
through the real store without the model (a tokenizer stand-in rebuilds prompts)."""

from __future__ import annotations

import pytest

from tttr.app.bench import generate
from tttr.app.screens.compare import CompareScreen
from tttr.app.screens.timeline import TimelineScreen
from tttr.app.tui import TTTRApp
from tttr.app.widgets.detail import DetailPane
from tttr.app.widgets.side_by_side import SideBySide
from tttr.app.widgets.timeline import Timeline
from tttr.engine.replay.events import ids_digest

from tests.app_helpers import run_app, wait_for


class FakeTokenizer:
    """A character-level tokenizer: enough for `prompts` to rebuild and encode a prompt.
    Its chat template carries text a terminal or Rich would act on, to show it is inert."""

    vocab_size = 0x110000

    def apply_chat_template(self, messages, add_generation_prompt=True):
        body = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        return "[bold red]system[/] \x1b[31mtool list\n" + body + "<assistant>"

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("state") / "session.db"
    generate(path, 3 * 25 + 3, seed=1, tokens_per_step=10)
    generate(path, 3 * 25 + 3, seed=2, tokens_per_step=10)
    return path


def test_the_detail_of_a_prompt_is_its_text_rebuilt_from_the_record(db, monkeypatch):
    monkeypatch.setattr(TTTRApp, "prompt_tokenizer", lambda self, run: FakeTokenizer())

    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        detail = app.screen.query_one(DetailPane)
        timeline.cursor = timeline.view.at("1:prompt").seq
        await pilot.pause()
        await wait_for(pilot, lambda: "tool list" in detail.text)
        text = detail.text
        # the generated run's digests are random: the text is shown, and said to be unproved
        flat = " ".join(text.split())
        assert "not verified" in flat and "does not encode to the recorded digest" in flat
        assert "[bold red]system[/]" in text and "\x1b" not in text  # recorded text, never markup
        assert "<user>" in text and "<assistant>" in text  # the task, then step 0's message and output
        assert "-rw-r--r--" in text
        # cached per run: back on another prompt, no second rebuild
        timeline.cursor = timeline.view.at("0:prompt").seq
        await pilot.pause()
        assert "tool list" in detail.text and "<assistant>" in detail.text

    run_app(db, flow, run_id=1, load_tokenizer=True)


def test_a_prompt_that_encodes_to_its_recorded_digest_reads_verified(tmp_path, monkeypatch):
    from tttr.engine.replay.prompts import prompts
    from tttr.sessions.store import Store

    path = tmp_path / "s.db"
    store = Store.open(path, create=True)
    try:
        run = store.begin_run(task="rotate-logs", model_id="m", kernel_mode="invariant", sampling={}, seed=0,
                              fingerprint={}, meta={})
        first = FakeTokenizer().apply_chat_template([{"role": "user", "content": "x"}])
        store.append(run, "0:prompt", {"ids_digest": "0" * 32, "n_tokens": len(first)})
        store.commit_step(run)
        store.finish_run(run, "complete", {"passed": True})
        # the digest the rebuild will produce, written as the recorder would have
        rebuilt = prompts(store, run, FakeTokenizer())[0]
        assert not rebuilt.verified
    finally:
        store.close()
    store = Store.open(path, create=False)
    try:
        run = store.begin_run(task="rotate-logs", model_id="m", kernel_mode="invariant", sampling={}, seed=0,
                              fingerprint={}, meta={})
        store.append(run, "0:prompt",
                     {"ids_digest": ids_digest(FakeTokenizer().encode(rebuilt.text)), "n_tokens": rebuilt.n_tokens})
        store.commit_step(run)
        store.finish_run(run, "complete", {"passed": True})
    finally:
        store.close()
    monkeypatch.setattr(TTTRApp, "prompt_tokenizer", lambda self, run: FakeTokenizer())

    async def flow(app, pilot):
        detail = app.screen.query_one(DetailPane)
        await wait_for(pilot, lambda: "verified" in detail.text)
        assert "✓ verified" in detail.text and "not verified" not in detail.text

    run_app(path, flow, run_id=run, load_tokenizer=True)


def test_without_a_tokenizer_a_prompt_says_why_it_has_no_text(db):
    async def flow(app, pilot):
        timeline = app.screen.query_one(Timeline)
        timeline.cursor = timeline.view.at("0:prompt").seq
        await pilot.pause()
        text = app.screen.query_one(DetailPane).text
        assert "tokens" in text and "without a tokenizer" in text

    run_app(db, flow, run_id=1, load_tokenizer=False)


# -- a fork of the setup clock, side by side ---------------------------------------------
PARENT_CLOCK, CHILD_CLOCK = "2026-03-02T10:00:00", "2026-04-01T10:00:00"
STEPS = ("ls -la /var/log", "find /var/log -name '*.log' -mtime +7 -delete")


def _record(store, *, clock, tree, outcome, parent=None, mutation=None) -> int:
    """A rotate-logs run as the agent loop writes it: setup (clock, tree), then per step a
    prompt, two tokens, the message, the action, the clock and the tool result."""
    run = store.begin_run(task="rotate-logs", model_id="m", kernel_mode="invariant", sampling={}, seed=0,
                          fingerprint={}, meta={}, parent=parent,
                          fork_site=mutation["site"] if mutation else None, mutation=mutation)
    store.append(run, "-1:clock", {"t": clock})  # as older databases spell the setup step
    store.append(run, "-1:setup", {"task": "rotate-logs", "clock": clock, "tree": tree,
                                                         "snapshot": None})
    store.commit_step(run)
    for step, cmd in enumerate(STEPS):
        store.append(run, f"{step}:prompt", {"ids_digest": "0" * 32, "n_tokens": 40})
        for pos, word in enumerate(("ok", "\n")):
            store.append(run, f"{step}:token:{pos}",
                         {"id": pos, "text": word, "forced": False, "logprob": -0.1, "rng": [0, step, pos]})
        store.append(run, f"{step}:message", {"text": "ok\n"})
        store.append(run, f"{step}:action", {"cmd": cmd})
        store.append(run, f"{step}:clock", {"t": f"2026-03-02T10:00:0{step + 1}"})
        store.append(run, f"{step}:tool", {
            "cmd": cmd, "cwd": "/work", "stdout": "app.log\n", "stderr": "", "exit_code": 0, "duration_ms": 3,
            "stdout_size": 8, "stderr_size": 0, "truncated": False, "tree_before": tree, "tree_after": tree,
            "snapshot": None})
        store.commit_step(run)
    store.finish_run(run, "complete", outcome)
    return run


@pytest.fixture(scope="module")
def clock_fork(tmp_path_factory):
    from tttr.sessions.store import Store

    path = tmp_path_factory.mktemp("clockfork") / "session.db"
    store = Store.open(path, create=True)
    try:
        parent = _record(store, clock=PARENT_CLOCK, tree="a" * 64, outcome={
            "passed": True, "checker_exit": 0, "checker_output": "kept app.log (8 days old)\nok"})
        child = _record(store, clock=CHILD_CLOCK, tree="b" * 64, parent=parent, outcome={
            "passed": False, "checker_exit": 1, "checker_output": "deleted app.log (0 days old)"},
            mutation={"site": "-1:clock", "value": CHILD_CLOCK, "input": "+30d"})
    finally:
        store.close()
    return path, parent, child


def test_a_fork_of_the_setup_clock_shows_the_setup_row_as_the_fork(clock_fork):
    path, parent, child = clock_fork

    async def flow(app, pilot):
        await pilot.press("d")  # diff vs parent
        assert isinstance(app.screen, CompareScreen)
        side = app.screen.query_one(SideBySide)
        await wait_for(pilot, lambda: side.comparison is not None)
        rows = side.rows
        assert len(rows) == 1 + len(STEPS)
        setup = rows[0]
        assert setup.a.step == setup.b.step == -1 and setup.fork and setup.first_divergence and not setup.same
        assert (setup.a.action, setup.b.action) == (PARENT_CLOCK, CHILD_CLOCK)
        assert all(r.same and not r.fork for r in rows[1:])
        assert side.cursor == 0  # the compare opens on the first divergence
        summary = " ".join(str(app.screen.query_one("#compare-summary").render()).split())
        assert "identical" not in summary
        # stored in the setup step's old spelling (`-1:clock`), shown in the one spelling
        assert f"setup:clock = +30d → {CHILD_CLOCK}" in summary and "-1:clock" not in summary
        assert "setup:clock (trace)" in summary and PARENT_CLOCK in summary
        assert "passed: kept app.log (8 days old)" in summary and "failed: deleted app.log (0 days old)" in summary
        assert "the same actions led to a different outcome" in summary
        title = str(app.screen.query_one("#compare-title").render())
        assert f"+30d → {CHILD_CLOCK}" in title
        # n/p reach the setup row: from the last row back to it
        await pilot.press("end", "p")
        assert side.cursor == 0
        await pilot.press("n")
        assert side.cursor == 0  # nothing differs after it: the cursor stays (the rows are all same)

    run_app(path, flow, run_id=child, load_tokenizer=False)


# -- from the compare screen to a timeline and back ----------------------------------------
def test_b_opens_the_right_run_scrolled_to_its_step_and_escape_says_where_it_goes(db):
    from tttr.app.screens.help import HelpScreen

    async def flow(app, pilot):
        await pilot.press("space", "down", "space", "d")
        compare = app.screen
        assert isinstance(compare, CompareScreen)
        assert compare.active_bindings["escape"].binding.description == "back to runs"
        side = compare.query_one(SideBySide)
        await wait_for(pilot, lambda: side.comparison is not None)
        await pilot.press("end", "b")  # the last step of the right run: far below the first screenful
        assert isinstance(app.screen, TimelineScreen)
        timeline = app.screen.query_one(Timeline)
        assert timeline.view.run_id == 2 and timeline.view.event(timeline.cursor).step == 2
        await pilot.pause()
        top, height = timeline.scroll_offset.y, timeline.scrollable_content_region.height
        assert timeline.on_step_row  # the step's row in the step tree, in view
        assert top <= timeline.rows.row_of(timeline.cursor) < top + height
        assert app.screen.active_bindings["escape"].binding.description == "back to compare"
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        shown = app.screen.content.plain
        assert "back to compare" in shown and "back to runs" not in shown
        await pilot.press("escape", "escape")
        assert app.screen is compare

    run_app(db, flow, load_tokenizer=False)
