"""The app against hostile session databases: each case writes a valid session through the
real store, then corrupts it with plain SQL the way a shared file could arrive (terminal
control sequences, Rich markup, values of the wrong type for their kind, nesting 100,000
deep, a compression bomb, integers past 64 bits, a value that is not JSON), and drives the
app over it with Textual's pilot: the runs list, every event of the timeline with its
detail, the edit dialog, search, and the two runs side by side.

What must hold for every case: no exception, nothing the app paints holds a raw control
character (escapes are shown as `\\x1b`), markup shows as the literal brackets it is, an
unreadable value says so where it is shown, and the database file is unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import json
import re
import shutil
import sqlite3
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
from tttr.app.bench import COMMANDS, generate
from tttr.app.screens.compare import CompareScreen
from tttr.app.screens.edit import EditScreen
from tttr.app.screens.runs import RunsScreen
from tttr.app.screens.search import SearchScreen
from tttr.app.screens.timeline import TimelineScreen
from tttr.app.tui import TTTRApp
from tttr.app.widgets.detail import DetailPane
from tttr.app.widgets.side_by_side import SideBySide
from tttr.app.widgets.timeline import Timeline

from tests.app_helpers import SIZE, open_store, wait_for

TOKENS = 2  # per step: a short run, so every event can be visited in every case
EVENTS = 40
OTHER = COMMANDS[:2] + ("rm -rf /var/log/old",) + COMMANDS[3:]
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202e"  # retitle, clear screen, C1 CSI, bidi override
BOMB_BYTES = 300 * 1024 * 1024  # expands from ~300 KiB, as in the issue; the store expands only a prefix


# -- building the databases ------------------------------------------------------------------
@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """Two complete runs written through the real store; each case corrupts a copy."""
    path = tmp_path_factory.mktemp("hostile") / "template.db"
    generate(path, EVENTS, seed=1, tokens_per_step=TOKENS)
    generate(path, EVENTS, seed=2, tokens_per_step=TOKENS, commands=OTHER)
    return path


def event_id(db: sqlite3.Connection, kind: str, nth: int = 0, run: int = 1) -> int:
    """The row id of run `run`'s `nth` event of `kind`."""
    return db.execute(
        "SELECT e.id FROM events e JOIN kinds k ON k.code = e.kind WHERE e.id >> 32 = ? AND k.kind = ?"
        " ORDER BY e.id LIMIT 1 OFFSET ?", (run, kind, nth),
    ).fetchone()[0]


def value_of(db: sqlite3.Connection, kind: str, nth: int = 0) -> dict:
    stored = db.execute("SELECT value FROM events WHERE id = ?", (event_id(db, kind, nth),)).fetchone()[0]
    return json.loads(stored)


def set_value(db: sqlite3.Connection, kind: str, text: str, nth: int = 0) -> None:
    """Store `text` verbatim as the value of run 1's `nth` event of `kind` (JSON text, the
    form the store decodes with json.loads)."""
    db.execute("UPDATE events SET value = ? WHERE id = ?", (text, event_id(db, kind, nth)))


def token_json(**fields) -> str:
    value = {"id": 17, "text": "x", "forced": False, "logprob": -0.5, "rng": [1, 0, 0]}
    value.update(fields)
    return json.dumps(value)


@dataclass
class Case:
    corrupt: Callable[[sqlite3.Connection], None]
    kind: str | None = None  # the kind of the corrupted event (run 1's first one)
    unreadable: bool = False  # the event must be marked unreadable where it is shown
    shown: list = field(default_factory=list)  # literal text the corrupted event's detail shows (or choices)
    runs_shown: list = field(default_factory=list)  # literal text the runs list shows (or a tuple of choices)
    compare_shown: list[str] = field(default_factory=list)  # literal text the compare screen shows
    timeline_shown: list[str] = field(default_factory=list)  # literal text some timeline screen shows
    editable: bool = True  # a readable clock, tool or token opens the edit dialog


def _controls(db):
    db.execute("UPDATE runs SET task = ?, model_id = ? WHERE id = 1", ("deploy" + ESCAPES, "model\x1b[31m"))
    tool = value_of(db, "tool")
    tool["cmd"] = "echo " + ESCAPES
    tool["stdout"] = "out\x9b2J" + ESCAPES + "\nline two\x1b[31m"
    tool["env"]["PS1"] = "\x1b[2J"
    set_value(db, "tool", json.dumps(tool))
    set_value(db, "action", json.dumps({"cmd": "echo " + ESCAPES}))
    set_value(db, "message", json.dumps({"text": "said\x1b[2J" + ESCAPES}))
    set_value(db, "token", token_json(text="\x1b[2J\x9b"))


def _markup(db):
    db.execute("UPDATE runs SET task = ?, model_id = ?, status = ? WHERE id = 1",
               ("[/oops]", "[bold]x", "[/]"))
    tool = value_of(db, "tool")
    tool["cmd"] = "tr '[a-z]' '[A-Z]' < names.txt"
    tool["stdout"] = "s/[/]/_/g [/oops] [bold]x"
    set_value(db, "tool", json.dumps(tool))
    set_value(db, "action", json.dumps({"cmd": "sed -e 's/[/]/_/g' paths.txt"}))
    set_value(db, "message", json.dumps({"text": "[bold]x [/oops] [link=http://x]y[/link]"}))
    set_value(db, "token", token_json(text="[/]"))


@functools.cache
def bomb() -> tuple[str, bytes]:
    """(sha256, zlib stream) of BOMB_BYTES zeros, made a megabyte at a time."""
    digest, packed = hashlib.sha256(), zlib.compressobj(9)
    chunk, parts = bytes(1 << 20), []
    for _ in range(BOMB_BYTES >> 20):
        digest.update(chunk)
        parts.append(packed.compress(chunk))
    parts.append(packed.flush())
    return digest.hexdigest(), b"".join(parts)


def _bomb(db):
    blob, packed = bomb()
    db.execute("INSERT INTO blobs (digest, size, codec, data) VALUES (?, ?, 'zlib', ?)", (blob, BOMB_BYTES, packed))
    tool = value_of(db, "tool")
    tool["stdout"] = {"$blob": blob, "size": BOMB_BYTES}
    set_value(db, "tool", json.dumps(tool))


def _huge_output(db):
    tool = value_of(db, "tool")
    tool["stdout"] = ("[/oops] \x1b[2J" + "A" * 1000 + "\n") * 5000
    set_value(db, "tool", json.dumps(tool))


def _huge_integers(db):
    tool = value_of(db, "tool")
    tool["exit_code"], tool["duration_ms"], tool["stdout_size"] = 10**30, -(10**25), 2**70
    set_value(db, "tool", json.dumps(tool))
    set_value(db, "token", token_json(id=2**80, logprob=1e308))


def _names(db):
    """A verbatim site and a kind name, both hostile (the kinds table is part of the file)."""
    db.execute("UPDATE events SET site = ? WHERE id = ?", ("0:tool[/oops]\x1b[2J", event_id(db, "tool")))
    db.execute("UPDATE kinds SET kind = ? WHERE kind = 'prompt'", ("prompt[/]\x9b",))


def _fork_description(db):
    """Run 2 made a fork of run 1 with a hostile site and mutation: the lineage column and
    the compare screen's fork line show them."""
    db.execute("UPDATE runs SET parent = 1, fork_seq = 5, fork_site = ?, mutation = ? WHERE id = 2",
               ("0:clock\x1b[2J", json.dumps({"text": "[/oops]\x1b]0;t\x07", "value": "[bold]x"})))


def _huge_step(db):
    """The last step numbered a trillion: stepping to it and back must not try every number between."""
    last = db.execute("SELECT max(id) FROM events WHERE id >> 32 = 1").fetchone()[0]
    db.execute("UPDATE events SET step = ? WHERE id = ?", (10**12, last))


def _sampling(db):
    db.execute("UPDATE runs SET sampling = '\"hot\"', fingerprint = '7', meta = '[1, 2]',"
               " outcome = '\"[/oops]\"' WHERE id = 1")


CASES: dict[str, Case] = {
    "control-sequences": Case(_controls, "tool", shown=["\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202e"],
                              runs_shown=["deploy\\x1b]0;pwned"], compare_shown=["\\x1b[2J"]),
    "markup": Case(_markup, "tool", shown=["tr '[a-z]' '[A-Z]' < names.txt", "s/[/]/_/g [/oops] [bold]x"],
                   runs_shown=["[/oops]", "[bold]x", "[/]"], compare_shown=["sed -e 's/[/]/_/g' paths.txt"]),
    "tool-is-a-string": Case(lambda db: set_value(db, "tool", '"just a string"'), "tool", unreadable=True),
    "clock-does-not-parse": Case(lambda db: set_value(db, "clock", '{"t": "yesterday at noon"}', nth=1),
                                 "clock", unreadable=True),
    "action-is-a-number": Case(lambda db: set_value(db, "action", "42"), "action", unreadable=True,
                               compare_shown=["unreadable"]),
    "token-id-is-text": Case(lambda db: set_value(db, "token", token_json(id="seventeen")), "token",
                             unreadable=True),
    # The run's metadata is shown as it is, or the run is marked unreadable (the store may refuse it).
    "sampling-not-an-object": Case(_sampling, runs_shown=[('"[/oops]"', "unreadable")]),
    "nested-100000-deep": Case(lambda db: set_value(db, "tool", "[" * 100_000 + "]" * 100_000), "tool",
                               unreadable=True),
    "not-json": Case(lambda db: set_value(db, "tool", '{"cmd": "ls", "stdout": '), "tool", unreadable=True),
    # Shown as the number it is, or refused by the store as beyond SQLite's 64-bit range.
    "huge-integers": Case(_huge_integers, "tool", shown=[(str(10**30), "unreadable")]),
    "compression-bomb": Case(_bomb, "tool", shown=["too large to show in full"], editable=False),
    "five-megabyte-output": Case(_huge_output, "tool", shown=["too large to show in full"], editable=False),
    "step-a-trillion": Case(_huge_step, timeline_shown=[str(10**12)[:4]]),
    "site-and-kind-names": Case(_names, timeline_shown=["0:tool[/oops]\\x1", "prompt[/]\\x9b"]),
    "fork-description": Case(_fork_description, runs_shown=[("[/oops]\\u001b]0;t\\u0007", "[/oops]\\x1b]0;t\\x07",
                                                             "unreadable")],
                             compare_shown=["\\x1b[2J"]),
}


def hostile_db(template: Path, tmp_path: Path, case: Case) -> Path:
    path = tmp_path / "hostile.db"
    shutil.copyfile(template, path)
    db = sqlite3.connect(path)
    try:
        with db:
            case.corrupt(db)
    finally:
        db.close()
    return path


def digest(path: Path) -> str:
    """The database as the next reader sees it: the file, and any write-ahead log."""
    h = hashlib.sha256(path.read_bytes())
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        h.update(wal.read_bytes())
    return h.hexdigest()


# -- reading the screen ------------------------------------------------------------------------
def screen_text(app) -> str:
    """Everything the app paints now (the screen and its toasts), as the terminal gets it."""
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


def assert_safe(app, where: str) -> str:
    text = screen_text(app)
    raw = RAW_CONTROL.search(text)
    assert raw is None, f"{where}: a raw control character {raw.group()!r} reaches the terminal"
    return text


def notices(app) -> list[str]:
    return [n.message for n in app._notifications]


def run(db: Path, flow, *, run_id: int | None = None):
    """`flow(app, pilot)` on the app over `db`; the app must end without an exception."""

    async def main():
        store = open_store(db)
        try:
            app = TTTRApp(store, run_id=run_id, load_tokenizer=False)
            async with app.run_test(size=SIZE) as pilot:
                await pilot.pause()
                result = await flow(app, pilot)
            assert app._exception is None, f"the app failed: {app._exception!r}"
            return result
        finally:
            store.close()

    return asyncio.run(main())


# -- the cases -----------------------------------------------------------------------------------
@pytest.mark.slow  # every event of every case through the app, ~8 s a case
@pytest.mark.parametrize("name", list(CASES))
def test_the_app_shows_a_hostile_database_safely(template, tmp_path, name):
    case = CASES[name]
    db = hostile_db(template, tmp_path, case)
    before = digest(db)

    async def flow(app, pilot):
        # The runs list.
        assert isinstance(app.screen, RunsScreen)
        text = assert_safe(app, "runs")
        for shown in case.runs_shown:
            choices = shown if isinstance(shown, tuple) else (shown,)
            assert any(c in text for c in choices), f"runs list: {shown!r} not shown"
        assert app.screen.query_one("#runs").row_count == 2

        # Every event of run 1, with its detail.
        await pilot.press("enter", "z", "home")  # the step tree, every step expanded: a row per event
        assert isinstance(app.screen, TimelineScreen)
        timeline, detail = app.screen.query_one(Timeline), app.screen.query_one(DetailPane)
        view = timeline.view
        target, target_detail, seen = None, "", ""
        for index in range(view.count):
            if index:
                await pilot.press("down")
            assert timeline.cursor == index
            seen += screen_text(app)
            event = view.event(index)
            if case.kind is not None and target is None and event.kind in (case.kind, "?") and (
                    not case.unreadable or "unreadable" in detail.text):
                target = index
                if case.kind == "tool":  # its output loads in a worker
                    await wait_for(pilot, lambda: "loading blob" not in detail.text, timeout=30)
                target_detail = detail.text
                line = assert_safe(app, f"timeline at {index}")
            else:
                assert_safe(app, f"timeline at {index}")
        # Stepping keys across the run, both ways.
        for key in ("end", "left", "left", "right", "home", "right", "right", "end"):
            await pilot.press(key)
            assert 0 <= timeline.cursor < view.count
            assert_safe(app, f"timeline after {key}")
        for shown in case.timeline_shown:
            assert shown in seen, f"timeline: {shown!r} not shown"
        if case.kind is not None:
            assert target is not None, f"no {case.kind} event of the run was shown"
            for shown in case.shown:
                choices = shown if isinstance(shown, tuple) else (shown,)
                assert any(c in target_detail for c in choices), f"detail: {shown!r} not shown"
            if case.unreadable:
                assert "unreadable" in target_detail
                row = next(ln for ln in line.splitlines() if "unreadable" in ln)
                assert "✗" in row  # the timeline line is marked too, not only the pane

        # The edit dialog: an unreadable value is refused with a reason; a readable one opens.
        if case.kind is not None:
            timeline.cursor = target
            await pilot.pause()
            await pilot.press("e")
            await pilot.pause()
            if case.unreadable or "unreadable" in target_detail:
                assert not isinstance(app.screen, EditScreen)
                assert_safe(app, "edit refused")
                assert any("unreadable" in m and "cannot be edited" in m for m in notices(app))
            elif case.kind in ("tool", "token", "clock") and case.editable:
                assert isinstance(app.screen, EditScreen)
                assert_safe(app, "edit dialog")
                await pilot.press("escape")
            elif not case.editable:
                assert not isinstance(app.screen, EditScreen)
                assert any("too large to show in full" in m for m in notices(app))
            assert isinstance(app.screen, (TimelineScreen, EditScreen))
            if isinstance(app.screen, EditScreen):
                await pilot.press("escape")

        # Search: indexed in a worker; an unreadable command or output is found as such.
        await pilot.press("slash")
        search = app.screen
        assert isinstance(search, SearchScreen)
        await wait_for(pilot, lambda: search.corpus is not None, timeout=30)
        await pilot.press(*("unreadable" if case.unreadable else "echo"))
        await pilot.pause()
        text = assert_safe(app, "search")
        if case.unreadable and case.kind in ("tool", "action"):
            assert any(h.entry.what == "unreadable" for h in search.hits)
            assert "unreadable" in text
        await pilot.press("escape")
        await pilot.press("escape")
        assert isinstance(app.screen, RunsScreen)

        # The two runs side by side.
        await pilot.press("space", "down", "space", "d")
        assert isinstance(app.screen, CompareScreen)
        side = app.screen.query_one(SideBySide)
        summary = app.screen.query_one("#compare-summary")
        await wait_for(pilot, lambda: side.comparison is not None or "diff failed" in str(summary.render()),
                       timeout=30)
        await pilot.pause()
        text = assert_safe(app, "compare")
        for shown in case.compare_shown:
            assert shown in text, f"compare: {shown!r} not shown"

        t0 = time.monotonic()
        await pilot.press("q")
        return t0

    started = run(db, flow)
    assert time.monotonic() - started < 10
    assert digest(db) == before, "the app changed the database"


def test_a_compression_bomb_loads_in_a_worker_and_q_quits_at_once(template, tmp_path):
    """The bomb's output is loaded off the UI thread: the pane first shows a placeholder (a
    read on the UI thread would go straight to the text), then the capped text; keys keep
    working meanwhile, and `q` ends the app while it loads."""
    db = hostile_db(template, tmp_path, CASES["compression-bomb"])
    before = digest(db)

    async def flow(app, pilot):
        timeline, detail = app.screen.query_one(Timeline), app.screen.query_one(DetailPane)
        shown: list[str] = []
        show = detail.show

        def record(renderable):  # what the pane shows, in order
            show(renderable)
            shown.append(detail.text)

        detail.show = record
        tool = timeline.view.at("0:tool").seq
        timeline.cursor = tool
        await wait_for(pilot, lambda: any("too large to show in full" in t for t in shown), timeout=60)
        assert "loading blob" in shown[0] and "too large to show in full" not in shown[0]
        # Again, and this time quit while it loads (the view forgot nothing: move away and back
        # to a fresh copy of the run instead).
        await pilot.press("escape")
        app.open_run(1)
        await pilot.pause()
        timeline, detail = app.screen.query_one(Timeline), app.screen.query_one(DetailPane)
        timeline.cursor = tool
        await pilot.press("up", "down")  # the screen answers keys meanwhile
        assert timeline.cursor == tool
        t0 = time.monotonic()
        await pilot.press("q")
        return t0

    started = run(db, flow, run_id=1)
    assert time.monotonic() - started < 10
    assert digest(db) == before


def test_an_over_cap_blob_says_it_is_too_large_to_show_in_full(template, tmp_path):
    db = hostile_db(template, tmp_path, CASES["compression-bomb"])

    async def flow(app, pilot):
        timeline, detail = app.screen.query_one(Timeline), app.screen.query_one(DetailPane)
        timeline.cursor = timeline.view.at("0:tool").seq
        await wait_for(pilot, lambda: "too large to show in full" in detail.text, timeout=60)
        assert "loading blob" not in detail.text
        # a blob that does not load in full cannot be edited as if it did
        await pilot.press("e")
        await pilot.pause()
        assert not isinstance(app.screen, EditScreen)
        assert_safe(app, "edit refused")
        assert any("too large to show in full" in m for m in notices(app))

    run(db, flow, run_id=1)


def test_snapshot_diffs_load_deferred_and_file_names_are_shown_safely(tmp_path):
    """The files a command changed come from two snapshot manifests (blobs): the app's view
    defers them to a worker, and a file named with control characters and markup is shown
    with its escapes visible."""
    from tttr.app.describe import detail
    from tttr.app.runview import LOADING, RunView, load_wanted
    from tttr.recorders.snapshot import snapshot
    from tttr.sessions.store import Store

    before_dir, after_dir = tmp_path / "before", tmp_path / "after"
    before_dir.mkdir()
    (before_dir / "kept.txt").write_text("same")
    shutil.copytree(before_dir, after_dir)
    hostile_name = "x\x1b[2J[bold]oops.log"
    (after_dir / hostile_name).write_text("new")
    path = tmp_path / "snap.db"
    store = Store.open(path, create=True)
    try:
        a, b = snapshot(before_dir, store), snapshot(after_dir, store)
        run_id = store.begin_run(task="t", model_id="m", kernel_mode="invariant", seed=1)
        store.append(run_id, "-1:setup", {"snapshot": a, "tree": "t0"})
        store.append(run_id, "0:tool", {
            "cmd": "touch x", "stdout": "", "stderr": "", "exit_code": 0, "duration_ms": 1,
            "tree_before": "t0", "tree_after": "t1", "snapshot": b})
        store.commit_step(run_id)
        store.finish_run(run_id, "complete")
    finally:
        store.close()

    store = open_store(path)
    try:
        view = RunView(store, run_id, defer_blobs=True)
        tool = view.at("0:tool")
        assert view.files_changed(tool) is LOADING
        assert "loading the snapshots" in _plain(detail(view, tool))
        view.merge_loaded(load_wanted(store, view.take_wanted()))
        changes = view.files_changed(tool)
        assert [(c.path, c.change) for c in changes] == [("x\\x1b[2J[bold]oops.log", "added")]
        shown = _plain(detail(view, tool))
        assert "+ x\\x1b[2J[bold]oops.log" in shown and "\x1b" not in shown
        # A script's view reads the same directly.
        assert RunView(store, run_id).files_changed(tool) == changes
    finally:
        store.close()


def _plain(renderable) -> str:
    from rich.console import Console

    console = Console(width=120, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


HOSTILE_VALUES = [
    None, 42, True, 1e308, float("nan"), "text\x1b[2J[/oops]", [1, "[/]"], {"t": 5},
    {"t": "2026-01-01T00:00:00\x1b[2J"}, {"t": "[/oops]"},
    {"cmd": 5, "stdout": ["x"], "exit_code": "zero", "env": "x", "duration_ms": [1]},
    {"cmd": "ls", "stdout": "\x9b", "env": {"K\x1b": ["v"]}, "exit_code": True},
    {"id": "x", "text": 5}, {"id": 1, "text": "[bold]\x1b", "logprob": "low", "rng": {"a": 1}},
    {"id": 2**80, "text": "x", "logprob": float("inf")},
    {"topk": [["a", "b"]], "batch": [1]}, {"topk": "x", "batch": "y"}, {"topk": [[1, 0.5, 7]], "batch": [2, "z"]},
    {"text": {"$blob": 5}}, {"cmd": {"$blob": "nothex\x1b", "size": "big"}, "stdout": {"$blob": "0" * 64}},
    {"done": "[/]"}, {"passed": "[/oops]", "checker_exit": {"x": 1}, "checker_output": 7},
    json.loads("[" * 50 + "]" * 50),
]
KINDS = ["clock", "tool", "token", "logits", "prompt", "message", "action", "outcome", "setup", "[/oops]\x1b"]


def test_every_kind_with_every_hostile_value_renders_safely(template):
    """describe's summary and detail, for every kind and a value of every wrong shape: no
    exception, no raw control character, and a value of the wrong shape says so."""
    from tttr.app.describe import detail, summary
    from tttr.app.runview import RunView, value_problem
    from tttr.sessions.records import Event

    store = open_store(template)
    try:
        view = RunView(store, 1, defer_blobs=True)
        for kind in KINDS:
            for value in HOSTILE_VALUES:
                event = Event(1, 5, 0, "trace", kind, "0:" + kind, value)
                line = _plain(summary(event))
                pane = _plain(detail(view, event))
                for shown in (line, pane):
                    assert RAW_CONTROL.search(shown) is None, (kind, value, shown)
                if value_problem(event) is not None:
                    assert "unreadable" in line and "unreadable" in pane, (kind, value)
                    assert "cannot be shown as its kind, nor edited" in pane
        # The store's own verdict is shown as it is.
        marked = Event(1, 5, 0, "trace", "tool", "0:tool", None, 1, "tool value is \x1b[2J nested too deeply")
        assert "unreadable: tool value is \\x1b[2J nested too deeply" in _plain(summary(marked))
    finally:
        store.close()
