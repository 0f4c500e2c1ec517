"""The files of a run at any step, and the difference between two steps or two runs
(`tttr.recorders.treestate`, `tttr files`).

The runs are recorded through the trace layer itself: a real task's setup and real commands
in the real sandbox (`engine.replay.world.World`, the object the agent loop runs commands
with), real snapshots into a real session database, events in the shape the loop writes
them. Only the model is left out: the commands are given, so each test knows what the files
must be. `record_scripted` is also how tests/test_app_files.py builds its runs."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta

import pytest

from tests.sandbox_helpers import needs_sandbox
from tttr.app.cli import main
from tttr.engine.replay.events import EventLog
from tttr.engine.replay.source import Source
from tttr.engine.replay.world import World
from tttr.recorders.sandbox import Executor
from tttr.recorders.tasks import load_task
from tttr.recorders.treestate import (SHOW_LIMIT, RunTrees, TreeStateError, diff_runs_at, diff_steps, file_text,
                                      text_diff, tree_at)
from tttr.sessions.store import Store
from tttr.sessions.vocabulary import site

pytestmark = needs_sandbox

CLOCK = datetime(2026, 3, 2, 10, 0, 0)
HOSTILE = "\x1b]0;pwned\x07[bold red]x[/]"
COMMANDS_A = (
    "echo hello world > greeting.txt",                                        # 0: adds greeting.txt
    "ls",                                                                     # 1: changes nothing
    "printf 'a\\000b' > bin.dat; chmod 755 README",                            # 2: a binary file, a mode
    f"head -c {SHOW_LIMIT + 10} /dev/zero | tr '\\000' x > big.txt; printf '\\033]0;pwned\\007[bold red]x[/]'"
    " > \"$(printf 'ev\\033il.txt')\"",                                       # 3: a large file, a hostile one
)
COMMANDS_B = ("echo hello > greeting.txt", "rm README")


def record_scripted(store, task: str, commands, *, tokenizer=None, parent: int | None = None,
                    fork_step: int | None = None) -> int:
    """Record a run of `task` whose agent runs `commands`, one a step, in the real sandbox.
    With `parent` and `fork_step`, the run is a fork of `parent` sharing its events before
    step `fork_step`'s tool call (as `tttr fork` stores one: only the new events, and no
    snapshot of a tree the parent recorded). With `tokenizer`, each step's message is also recorded as
    its tokens (the model's tokenizer's ids and texts)."""
    t = load_task(task)
    manifests = Source(store, parent).manifests if parent is not None else None
    run = store.begin_run(task=t.name, model_id="scripted", kernel_mode="invariant",
                          sampling={"temperature": 0.0, "top_p": 1.0, "top_k": 0}, seed=1, fingerprint={},
                          parent=parent, fork_site=None if parent is None else site(fork_step, "tool"),
                          meta={"clock": CLOCK.isoformat()})
    fork_seq = store.run(run).fork_seq
    world = World(store=store, task=t, seed=1, executor_factory=lambda tree, seed: Executor(tree, seed=seed),
                  log=EventLog(store, run), manifests=manifests)
    seq = 0

    def add(step: int, kind: str, value, pos: int | None = None) -> None:
        nonlocal seq
        if fork_seq is None or seq >= fork_seq:
            store.append(run, site(step, kind, pos), value)
        seq += 1

    try:
        add(-1, "clock", {"t": CLOCK.isoformat()})
        add(-1, "setup", world.set_up(CLOCK))
        store.commit_step(run)
        for step, cmd in enumerate(commands):
            clock = CLOCK + timedelta(seconds=step + 1)
            text = f"I will run it.\n```bash\n{cmd}\n```"
            if tokenizer is not None:
                for pos, token_id in enumerate(tokenizer.encode(text)):
                    add(step, "token", {"id": token_id, "text": tokenizer.decode([token_id]), "forced": False,
                                        "logprob": -0.1, "rng": [1, step, pos]}, pos)
            add(step, "message", {"text": text})
            add(step, "action", {"cmd": cmd})
            add(step, "clock", {"t": clock.isoformat()})
            value = world.run(step, cmd, clock)
            add(step, "tool", value)
            world.advance(value)
            store.commit_step(run)
        last = len(commands) - 1
        outcome = world.check(CLOCK + timedelta(seconds=len(commands) + 1))
        add(last, "outcome", outcome)
        store.finish_run(run, "complete", outcome)
    finally:
        world.close()
    return run


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    """Run 1 (COMMANDS_A), run 2 (COMMANDS_B), run 3: a fork of run 1 at 3:tool that ran
    the same command again."""
    path = tmp_path_factory.mktemp("files") / "session.db"
    with Store.open(path, create=True) as store:
        a = record_scripted(store, "write-line", COMMANDS_A)
        b = record_scripted(store, "write-line", COMMANDS_B)
        c = record_scripted(store, "write-line", COMMANDS_A, parent=a, fork_step=3)
        assert (a, b, c) == (1, 2, 3)
    return path


@pytest.fixture()
def store(db):
    with Store.open(db, create=False, readonly=True) as s:
        yield s


def _cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# -- the domain --------------------------------------------------------------------------

def test_the_tree_at_each_step_is_the_tree_its_commands_left(store):
    trees = RunTrees(store, 1)
    assert trees.last_step == 3
    assert sorted(trees.at(-1).files) == ["README"] and trees.at(-1).site == site(-1, "setup")
    assert sorted(trees.at(0).files) == ["README", "greeting.txt"] and trees.at(0).site == "0:tool"
    assert trees.at(1).digest == trees.at(0).digest  # `ls` changed nothing
    assert sorted(trees.at(2).files) == ["README", "bin.dat", "greeting.txt"]
    assert trees.at(2).files["README"].mode == 0o755
    assert file_text(store, trees.at(0).files["greeting.txt"]).text == "hello world\n"
    assert tree_at(store, 1).digest == trees.at(3).digest  # default: the last step
    with pytest.raises(TreeStateError, match="run 1 has no step 4: its steps are setup, 0 to 3"):
        trees.at(4)


def test_the_difference_of_two_steps_names_each_file_and_diffs_text(store):
    diff = diff_steps(store, 1, -1, 2)
    assert [(c.path, c.change, c.what) for c in diff.changes] == [
        ("README", "changed", "mode"), ("bin.dat", "added", "added"), ("greeting.txt", "added", "added")]
    assert diff.counts() == {"added": 2, "removed": 0, "changed": 1}
    greeting = next(c for c in diff.changes if c.path == "greeting.txt")
    assert text_diff(store, greeting).text.splitlines()[-1] == "+hello world"
    assert text_diff(store, diff.changes[0]).note == "same content (mode changed)"
    assert diff_steps(store, 1, 0, 1).same and not diff_steps(store, 1, 0, 1).changes


def test_binary_and_large_files_are_named_not_read_out(store):
    files = tree_at(store, 1, 3).files
    assert file_text(store, files["bin.dat"]) .note == "binary, 3 bytes"
    big = file_text(store, files["big.txt"])
    assert big.text is None and big.note == f"too large to show: {SHOW_LIMIT + 10:,} bytes"
    change = next(c for c in diff_steps(store, 1, 2, 3).changes if c.path == "big.txt")
    assert text_diff(store, change).note.startswith("too large to show")


def test_the_same_step_of_two_runs_and_of_a_fork_and_its_parent(store):
    diff = diff_runs_at(store, 1, 2, 1)
    assert [(c.path, c.change) for c in diff.changes] == [("README", "removed"), ("greeting.txt", "changed")]
    assert text_diff(store, diff.changes[1]).text.splitlines()[-2:] == ["-hello world", "+hello"]
    # Run 2 ended after step 1: its final tree stands for its step 3.
    assert diff_runs_at(store, 1, 2, 3).b.step == 1
    # The fork re-ran step 3's command in its own event: the same tree as its parent's.
    assert store.event_at(3, "3:tool").origin == 3 and store.event_at(3, "2:tool").origin == 1
    assert tree_at(store, 3, 3).note is None and tree_at(store, 3, 3).digest == tree_at(store, 1, 3).digest
    assert diff_runs_at(store, 1, 3, 3).same


def test_a_run_that_recorded_no_snapshot_says_so(tmp_path, capsys):
    from tttr.app.bench import generate

    path = tmp_path / "bench.db"
    generate(path, 200, seed=1, tokens_per_step=5)
    with Store.open(path, create=False, readonly=True) as store:
        tree = tree_at(store, 1, 0)
    assert tree.entries == () and "no snapshot of tree" in tree.note
    code, out, err = _cli(capsys, "files", str(path), "1", "--step", "0")
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and "no snapshot of tree" in err


# -- the command line -------------------------------------------------------------------

def test_files_lists_a_step_and_prints_one_file(db, capsys):
    code, out, _ = _cli(capsys, "files", str(db), "1", "--step", "0")
    assert code == 0
    assert out.splitlines()[0].startswith("run 1 after step 0 (0:tool): 2 entries")
    assert any(line.startswith("-rw-r--r--") and line.endswith("greeting.txt") for line in out.splitlines())
    code, out, _ = _cli(capsys, "files", "1", "--db", str(db), "--step", "setup", "--path", "README")
    assert code == 0 and out == "greeting.txt should say hello world\n"
    code, out, _ = _cli(capsys, "files", str(db), "1", "--step", "setup")
    assert code == 0 and out.splitlines()[0].startswith("run 1 after step setup (setup:setup)"), out  # as sites write it
    code, out, _ = _cli(capsys, "files", str(db), "1", "--path", "bin.dat")
    assert code == 0 and out == "bin.dat: binary, 3 bytes\n"


def test_files_diff_and_against_print_the_changes_and_text_diffs(db, capsys):
    code, out, _ = _cli(capsys, "files", str(db), "1", "--diff", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "run 1 step 1 → step 2: 1 added, 0 removed, 1 changed"
    assert "  ~ README  (mode -rw-r--r-- → -rwxr-xr-x)" in lines and "  + bin.dat  (added, 3 bytes)" in lines
    code, out, _ = _cli(capsys, "files", str(db), "1", "--against", "2", "--step", "1", "--path", "greeting.txt")
    assert code == 0
    assert out.splitlines()[0] == "run 1 step 1 → run 2 step 1: 0 added, 0 removed, 1 changed"
    assert "-hello world" in out.splitlines() and "+hello" in out.splitlines() and "README" not in out
    code, out, _ = _cli(capsys, "files", str(db), "1", "--diff", "1", "--step", "0")
    assert code == 0 and out == "run 1 step 0 → step 1: no file differs\n"


def test_files_json(db, capsys):
    code, out, _ = _cli(capsys, "files", str(db), "1", "--against", "2", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["a"]["step"] == 3 and doc["b"]["step"] == 1 and doc["same"] is False
    by_path = {c["path"]: c for c in doc["changes"]}
    assert by_path["greeting.txt"]["diff"].endswith("-hello world\n+hello")
    assert by_path["big.txt"]["change"] == "removed" and by_path["big.txt"]["note"].startswith("too large")
    code, out, _ = _cli(capsys, "files", str(db), "1", "--step", "0", "--path", "greeting.txt", "--json")
    doc = json.loads(out)
    assert doc["text"] == "hello world\n" and [f["path"] for f in doc["files"]] == ["greeting.txt"]


def test_hostile_names_and_contents_are_shown_not_acted_on(db, capsys):
    code, out, _ = _cli(capsys, "files", str(db), "1", "--step", "3")
    assert code == 0 and "\x1b" not in out and "ev\\x1bil.txt" in out
    code, out, _ = _cli(capsys, "files", str(db), "1", "--step", "3", "--path", "ev\x1bil.txt")
    assert code == 0 and "\x1b" not in out and "\x07" not in out and "[bold red]x[/]" in out
    code, out, _ = _cli(capsys, "files", str(db), "1", "--diff", "3", "--json")
    assert code == 0 and "\x1b" not in out and "\x07" not in out


def _exit_code(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's usage errors
        return exc.code


@pytest.mark.parametrize("argv, expected", [
    (["1", "--step", "9"], "run 1 has no step 9"),
    (["1", "--diff", "9"], "run 1 has no step 9"),  # S2 as given, not the step before it
    (["7"], "no run 7"),
    (["1", "--path", "nope"], "no file or directory 'nope' in run 1 after step 3"),
    (["1", "--step", "x"], "argument --step"),
    (["1", "--diff", "1", "--against", "2"], "not allowed with argument"),
    (["1", "--against", "9"], "no run 9"),
])
def test_bad_input_is_one_line_exit_2_and_the_file_is_untouched(db, capsys, argv, expected):
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    assert _exit_code(["files", str(db), *argv]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert expected in last and last.startswith("tttr")
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
