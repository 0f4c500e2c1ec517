"""The suite comparison screen (issue 30): from the stats screen, `c` compares the suite shown
with the one before it, as `tttr compare` prints it; on the oldest suite it says there is none.
A real SQLite store of two labelled suites (tests/test_compare.py builds them)."""

from __future__ import annotations

from tests.app_helpers import run_app, wait_for
from tests.test_compare import COLD, HOT, _fill
from tttr.app.screens.stats import StatsScreen
from tttr.app.screens.suite_compare import SuiteCompareScreen
from tttr.sessions.store import Store


def test_c_on_the_stats_screen_compares_with_the_previous_suite(tmp_path):
    db = tmp_path / "both.db"
    with Store.open(db) as s:
        _fill(s, "s1", "cold", COLD)
        _fill(s, "s2", "hot", HOT)

    async def flow(app, pilot):
        await pilot.press("S")
        await wait_for(pilot, lambda: isinstance(app.screen, StatsScreen) and app.screen.stats is not None)
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, SuiteCompareScreen) and app.screen.text is not None)
        text = app.screen.text
        assert "A: s2 (suite s2, label hot)" in text and "B: s1 (suite s1, label cold)" in text
        assert "overall A-B: +0.38" in text and "paired by run" in text
        assert "pass rate per task" in str(app.screen.query_one("#stats-plot").render())
        await pilot.press("escape")
        assert isinstance(app.screen, StatsScreen)
        await pilot.press("p")
        await wait_for(pilot, lambda: app.screen.stats.suite_id == "s1")
        await pilot.press("c")  # the oldest: nothing before it
        await pilot.pause()
        assert isinstance(app.screen, StatsScreen)
        assert "no earlier suite" in str(list(app._notifications)[-1].message)

    run_app(db, flow, load_tokenizer=False)
