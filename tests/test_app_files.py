"""The app's files view and the compare screen's token diff, driven by Textual's pilot on
runs recorded through the real sandbox with given commands (tests/test_files.py's
`record_scripted`: real task, real commands, real snapshots, real store), their messages
as the default model's tokenizer splits them."""

from __future__ import annotations

import re

import pytest

from tests.app_helpers import run_app, wait_for
from tests.sandbox_helpers import needs_sandbox
from tests.test_files import record_scripted
from tttr.app.screens.compare import CompareScreen
from tttr.app.screens.files import FilesScreen
from tttr.app.screens.timeline import TimelineScreen
from tttr.app.widgets.side_by_side import SideBySide
from tttr.sessions.store import Store

pytestmark = needs_sandbox

LEFT = ("echo hello world > greeting.txt", "printf 'a\\000b' > bin.dat", "ls")
RIGHT = ("echo hello > greeting.txt", "printf 'a\\000b' > bin.dat; rm README",
         "printf '\\033]0;pwned\\007[bold red]x[/]' > notes.txt")  # tests.test_files.HOSTILE


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    from tttr.engine.replay.runtime import Runtime

    tokenizer = Runtime().tokenizer  # reads the default model's vocabulary, not its weights
    path = tmp_path_factory.mktemp("app-files") / "session.db"
    with Store.open(path, create=True) as store:
        assert record_scripted(store, "write-line", LEFT, tokenizer=tokenizer) == 1
        assert record_scripted(store, "write-line", RIGHT, tokenizer=tokenizer) == 2
    return path


def _listing(screen: FilesScreen) -> list[tuple[str, str | None]]:
    return [(item.path, item.change) for item in screen.listed]


async def _files_shown(pilot, app) -> FilesScreen:
    await wait_for(pilot, lambda: isinstance(app.screen, FilesScreen) and app.screen.trees is not None)
    return app.screen


def test_f_on_the_timeline_shows_the_files_after_the_step_marked_against_the_step_before(db):
    async def flow(app, pilot):
        await wait_for(pilot, lambda: isinstance(app.screen, TimelineScreen))
        timeline = app.screen.timeline
        timeline.cursor = app.screen.view.step_start(1)
        await pilot.pause()
        await pilot.press("F")
        screen = await _files_shown(pilot, app)
        assert _listing(screen) == [("README", None), ("bin.dat", "added"), ("greeting.txt", None)]
        title = str(screen.query_one("#files-title").render())
        assert "run #1 after step 1, marked against step 0" in title
        # The cursor starts on the first changed file: a binary file, named, not dumped.
        await wait_for(pilot, lambda: "binary, 3 bytes" in screen.detail_text)
        assert "added, 3 bytes" in screen.detail_text
        await pilot.press("down")
        await wait_for(pilot, lambda: "hello world" in screen.detail_text)
        assert screen.detail_text.splitlines()[0].startswith("greeting.txt")
        await pilot.press("escape")
        assert isinstance(app.screen, TimelineScreen)
        # The setup step: its tree, nothing to mark against.
        timeline.cursor = 0
        await pilot.pause()
        await pilot.press("F")
        screen = await _files_shown(pilot, app)
        assert _listing(screen) == [("README", None)]
        await wait_for(pilot, lambda: "greeting.txt should say hello world" in screen.detail_text)
        return True

    assert run_app(db, flow, run_id=1, load_tokenizer=False)


def test_f_on_the_compare_screen_shows_the_same_step_of_both_runs_with_text_diffs(db):
    async def flow(app, pilot):
        app.push_screen(CompareScreen(1, 2))
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.comparison is not None)
        side = app.screen.query_one(SideBySide)
        side.cursor = next(i for i, r in enumerate(side.rows) if r.a is not None and r.a.step == 1)
        await pilot.pause()
        await pilot.press("f")
        screen = await _files_shown(pilot, app)
        assert "after step 1: run #1 ┃ run #2" in str(screen.query_one("#files-title").render())
        assert _listing(screen) == [("README", "removed"), ("bin.dat", None), ("greeting.txt", "changed")]
        await wait_for(pilot, lambda: "-greeting.txt should say hello world" in screen.detail_text)
        await pilot.press("down", "down")
        await wait_for(pilot, lambda: "+hello" in screen.detail_text.splitlines())
        assert "-hello world" in screen.detail_text.splitlines()
        await pilot.press("c")  # the file's contents instead of its diff
        await wait_for(pilot, lambda: "-hello world" not in screen.detail_text.splitlines())
        assert "hello" in screen.detail_text.splitlines()
        summary = str(screen.query_one("#files-summary").render())
        assert "0 added · 1 removed · 1 changed" in summary
        await pilot.press("escape")
        assert isinstance(app.screen, CompareScreen)
        # The last step: the hostile file's text is shown with its controls visible.
        side.cursor = next(i for i, r in enumerate(side.rows) if r.b is not None and r.b.step == 2)
        await pilot.pause()
        await pilot.press("F")
        screen = await _files_shown(pilot, app)
        assert ("notes.txt", "added") in _listing(screen)
        screen.query_one("#files-list").highlighted = [p for p, _ in _listing(screen)].index("notes.txt")
        await wait_for(pilot, lambda: "[bold red]x[/]" in screen.detail_text)
        assert "\x1b" not in screen.detail_text and "\\x1b]0;pwned\\x07" in screen.detail_text
        return True

    assert run_app(db, flow, load_tokenizer=False)


def _painted(widget):
    from textual.geometry import Region

    return widget.render_lines(Region(0, 0, widget.size.width, widget.size.height))


def _marked(widget) -> list[str]:
    """The texts the widget paints in reverse video (the marked tokens), line by line."""
    return ["".join(seg.text for seg in strip if seg.style is not None and seg.style.reverse).strip()
            for strip in _painted(widget)]


def _text(widget) -> str:
    return "\n".join(strip.text for strip in _painted(widget))


def test_the_compare_screen_marks_the_tokens_that_differ_between_the_two_messages(db):
    from tttr.app.widgets.side_by_side import MessagePair

    async def flow(app, pilot):
        app.push_screen(CompareScreen(1, 2))
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen) and app.screen.comparison is not None)
        side = app.screen.query_one(SideBySide)
        pair = app.screen.query_one(MessagePair)
        side.cursor = next(i for i, r in enumerate(side.rows) if r.a is not None and r.a.step == 0)
        await pilot.pause()
        diff = app.screen.comparison.message_diff(side.rows[side.cursor])
        # The messages as the tokenizer split them; only " world" is not in the right one.
        assert "".join(diff.a).endswith("echo hello world > greeting.txt\n```")
        assert [t for t, m in zip(diff.a, diff.a_marks) if m] == [" world"] and diff.differing == (1, 0)
        assert "message of step 0 · 1 of" in _text(pair) and "0 of" in _text(pair)
        assert [m for m in _marked(pair) if m] == ["world"]
        # The first divergence is a token: named by its recorded text beside its id.
        summary = str(app.screen.query_one("#compare-summary").render())
        assert re.search(r'" world" \(\d+\) → ', summary) and "0:token:" in summary  # text, then its id
        await pilot.press("n")  # the next differing row: step 1, where the right run also removed README
        await pilot.pause()
        row = side.rows[side.cursor]
        assert row.a.step == 1
        marked = [m for m in _marked(pair) if m]
        assert any("rm" in m for m in marked) and not any("printf" in m for m in marked)
        side.cursor = 0  # the setup's row: no message
        await pilot.pause()
        assert "no message on this row (the setup)" in _text(pair) and not any(_marked(pair))
        return True

    assert run_app(db, flow, load_tokenizer=False)


def test_a_run_without_snapshots_says_so_in_the_files_view(tmp_path):
    from tttr.app.bench import generate

    path = tmp_path / "bench.db"
    generate(path, 200, seed=1, tokens_per_step=5)  # agent-shaped events whose trees are digests only

    async def flow(app, pilot):
        await wait_for(pilot, lambda: isinstance(app.screen, TimelineScreen))
        app.screen.timeline.cursor = app.screen.view.step_start(0)
        await pilot.pause()
        await pilot.press("F")
        screen = await _files_shown(pilot, app)
        assert screen.listed == []
        await wait_for(pilot, lambda: "no snapshot of tree" in screen.detail_text)
        assert "no snapshot of tree" in str(screen.query_one("#files-summary").render())
        return True

    assert run_app(path, flow, run_id=1, load_tokenizer=False)


# -- where a file came from: tttr files --blame, and b on the files screen --------------------
def test_blame_names_the_step_and_command_that_last_wrote_a_file(db, capsys):
    from tttr.app.cli import main
    from tttr.engine.blame import blame
    from tttr.recorders.treestate import RunTrees, TreeStateError, diff_steps

    with Store.open(db, create=False, readonly=True) as store:
        written = blame(store, 1, "greeting.txt")
        assert (written.step, written.site, written.command) == (0, "0:tool", LEFT[0])
        assert written.change == ("added" if any(c.path == "greeting.txt" and c.change == "added"
                                                 for c in diff_steps(store, 1, -1, 0).changes) else "changed")
        assert store.events(1, written.seq, written.seq + 1)[0].site == "0:tool"
        readme = blame(store, 1, "README")  # never touched: the task's starting tree
        assert readme.step == -1 and readme.change == "in the starting tree" and readme.site == "setup:setup"
        removed = blame(store, 2, "README")
        assert (removed.step, removed.change, removed.command) == (1, "removed", RIGHT[1])
        assert blame(store, 2, "README", step=0).step == -1  # as of step 0 it was still the starting one
        with pytest.raises(TreeStateError, match="no file or directory 'nope.txt'"):
            blame(store, 1, "nope.txt")
        trees = RunTrees(store, 2)  # blame's public accessors agree with the tree at each step
        digest = trees.digests_through(trees.last_step)
        assert [digest(s) for s in range(-1, trees.last_step + 1)] == \
            [trees.tree_digest(s)[0] for s in range(-1, trees.last_step + 1)]
        assert trees.manifest_of(digest(1)) is not None and trees.manifest_of("0" * 64) is None
    assert main(["files", str(db), "1", "--blame", "greeting.txt"]) == 0
    out = capsys.readouterr().out
    assert out == f"greeting.txt: {written.change} at step 0 by {LEFT[0]} (0:tool)\n"
    assert main(["files", str(db), "2", "--blame", "README", "--json"]) == 0
    assert '"change": "removed"' in capsys.readouterr().out
    assert main(["files", str(db), "1", "--blame", "nope.txt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.txt" in err[0]
    assert main(["files", str(db), "1", "--diff", "0"]) == 0  # the setup step is named as sites write it
    assert capsys.readouterr().out.startswith("run 1 step setup → step 0:")


def test_b_on_a_file_goes_to_the_command_that_wrote_it(db):
    async def flow(app, pilot):
        await wait_for(pilot, lambda: isinstance(app.screen, TimelineScreen))
        timeline = app.screen.timeline
        await pilot.press("end", "F")  # the files after the last step
        screen = await _files_shown(pilot, app)
        screen.query_one("#files-list").highlighted = [p for p, _ in _listing(screen)].index("greeting.txt")
        await pilot.press("b")
        await wait_for(pilot, lambda: isinstance(app.screen, TimelineScreen))
        await wait_for(pilot, lambda: timeline.view.event(timeline.cursor).site == "0:tool")
        assert any("greeting.txt" in str(n.message) and "step 0" in str(n.message) for n in app._notifications)
        return True

    assert run_app(db, flow, run_id=1, load_tokenizer=False)


def test_files_named_are_the_tree_paths_a_command_names():
    from tttr.engine.blame import files_named

    tree = {"greeting.txt": 1, "logs/app.log": 1, "README": 1}
    assert files_named("cat greeting.txt logs/app.log", tree) == ["greeting.txt", "logs/app.log"]
    assert files_named("wc -l /work/logs/app.log > README", tree, "/work") == ["logs/app.log", "README"]
    assert files_named("grep 'hello world' ./greeting.txt", tree) == ["greeting.txt"]
    assert files_named("ls -la", tree) == [] and files_named("echo 'unclosed", tree) == []


def test_b_on_a_command_goes_to_the_step_that_wrote_the_file_it_reads(tmp_path):
    commands = ("echo hello world > greeting.txt", "ls", "cat greeting.txt")
    path = tmp_path / "reads.db"
    with Store.open(path, create=True) as store:
        run = record_scripted(store, "write-line", commands)

    async def flow(app, pilot):
        await wait_for(pilot, lambda: isinstance(app.screen, TimelineScreen))
        timeline = app.screen.timeline
        await pilot.press("end")  # the last step's row: `cat greeting.txt`
        assert timeline.view.event(timeline.cursor).step == 2
        await pilot.press("b")
        await wait_for(pilot, lambda: timeline.view.event(timeline.cursor).site == "0:tool")
        assert any("greeting.txt" in str(n.message) and "step 0" in str(n.message) for n in app._notifications)
        await pilot.press("right")  # step 1's row: `ls`
        assert timeline.view.event(timeline.cursor).site == "1:tool"
        await pilot.press("b")  # it names no file: said, and the cursor stays
        await wait_for(pilot, lambda: any("names no file" in str(n.message) for n in app._notifications))
        return True

    assert run_app(path, flow, run_id=run, load_tokenizer=False)
