"""The README's screenshots, made from a real recording: `python -m tttr.app.screenshots`.

It records a date task with `tttr demo` (the embedded model, the real sandbox), forks the
run at its setup clock (`tttr fork 1 --at setup:clock --set +30d`: the whole run a month
later), then drives the app headless with Textual's pilot and saves SVGs of the runs list,
a timeline, the edit dialog on a clock reading and the compare of the clock fork with its
parent into assets/screenshots/. `--db FILE` reuses a database that already holds such a
run and its fork (runs 1 and 2) instead of recording one (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TASK = "rotate-logs"  # a task whose outcome depends on the date
SIZE = (140, 36)
OUT = Path(__file__).resolve().parent.parent / "assets" / "screenshots"
SHOTS = ("runs.svg", "timeline.svg", "edit.svg", "compare.svg")


def record(db: Path) -> None:
    """A run of TASK and its fork at the setup clock, through the command line as a user would."""
    for argv in (["demo", "--task", TASK, "--seed", "1", "--db", str(db), "--no-open"],
                 ["fork", "1", "--at", "setup:clock", "--set", "+30d", "--db", str(db)]):
        out = subprocess.run([sys.executable, "-m", "tttr.app", *argv], capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"tttr {' '.join(argv)} failed: {out.stderr.strip()[-400:]}")


async def _until(pilot, condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("the app did not get there in time")
        await pilot.pause(0.05)


async def shoot(db: Path, out: Path) -> list[Path]:
    from tttr.app.screens.compare import CompareScreen
    from tttr.app.screens.edit import EditScreen
    from tttr.app.screens.runs import RunsScreen
    from tttr.app.screens.timeline import TimelineScreen
    from tttr.app.tui import TTTRApp
    from tttr.app.widgets.timeline import Timeline
    from tttr.sessions.store import Store

    out.mkdir(parents=True, exist_ok=True)
    store = Store.open(db, create=False, readonly=True)
    saved = []

    def save(name: str) -> None:
        saved.append(Path(app.save_screenshot(filename=name, path=str(out))))

    try:
        app = TTTRApp(store, load_tokenizer=True)
        async with app.run_test(size=SIZE) as pilot:
            await _until(pilot, lambda: isinstance(app.screen, RunsScreen))
            await pilot.pause(0.5)
            save("runs.svg")
            await pilot.press("enter")  # the first run's timeline
            await _until(pilot, lambda: isinstance(app.screen, TimelineScreen))
            await _until(pilot, lambda: bool(app._tokenizers))  # top-k alternatives as text
            timeline = app.screen.query_one(Timeline)
            timeline.cursor = timeline.view.at("0:token:3").seq
            await pilot.pause(0.5)
            save("timeline.svg")
            timeline.cursor = timeline.view.at("setup:clock").seq
            await pilot.pause()
            await pilot.press("e")
            await _until(pilot, lambda: isinstance(app.screen, EditScreen))
            await pilot.press(*"+30d")
            await pilot.pause(0.3)
            save("edit.svg")
            await pilot.press("escape")
            await _until(pilot, lambda: isinstance(app.screen, TimelineScreen))
            screen = CompareScreen(1, 2)
            app.push_screen(screen)
            await _until(pilot, lambda: screen.comparison is not None)
            await pilot.pause(0.5)
            save("compare.svg")
    finally:
        store.close()
    return saved


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tttr.app.screenshots", description=__doc__.split("\n\n")[1])
    parser.add_argument("--db", type=Path, help="a database holding a run (1) and its fork (2); default: record one")
    parser.add_argument("--out", type=Path, default=OUT, help=f"folder for the SVGs (default {OUT})")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tttr-screenshots-") as tmp:
        db = args.db
        if db is None:
            db = Path(tmp) / "demo.db"
            record(db)
        for path in asyncio.run(shoot(db, args.out)):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
