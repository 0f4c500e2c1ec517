"""`sdk.shell` under `tttr record`: a recorded tool call with the built-in agent's cassette and
snapshot semantics. Each command records the tree before and after it and a snapshot when it
changed files; a replay answers it from the recording only while the command and the tree
before it match, and puts its effects on the files back; a fork at it (`STEP:tool`, the
built-in grammar) gives the program the new output with the recorded effects. Real sandbox,
real store, the default model (loaded by `tttr record`, never asked: the program makes no
model call)."""

from __future__ import annotations

import textwrap
import time

import pytest

from tttr.recorders import sdk
from tttr.recorders.snapshot import read_manifest
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import cli_json, program_tree, replay_json

PROGRAM = textwrap.dedent("""\
    from tttr.recorders import sdk

    made = sdk.shell("echo made > made.txt; ls", timeout=10)
    with open("made.txt") as f:  # the command's effect, read by the program itself
        text = f.read()
    # EDIT
    seen = sdk.shell("cat made.txt; echo more >> made.txt", timeout=10)
    print(repr(made.stdout), repr(text), repr(seen.stdout), seen.exit_code)
""")


def _tools(store, run_id: int) -> list[dict]:
    return [e.value for e in store.load_run(run_id)[1] if e.kind == "tool" and "program" not in e.value]


def test_outside_a_recording_the_timeout_stops_the_command_and_what_it_started(tmp_path, monkeypatch):
    monkeypatch.delenv("TTTR_RECORDER_URL", raising=False)
    marker = tmp_path / "late"
    began = time.perf_counter()
    out = sdk.shell(f"echo started; (sleep 2; touch {marker}) & sleep 30", timeout=0.5)
    assert out.timed_out and out.exit_code is None and out.stdout == "started\n"
    assert time.perf_counter() - began < 10
    time.sleep(2.5)
    assert not marker.exists()  # the background job died with the command's process group


def test_a_tree_is_synced_in_place_to_a_snapshot(tmp_path):
    """What a pinned tool left is put back: extra entries go, missing and changed ones come,
    the same ones keep their times, the program's own file is never touched."""
    import os

    from tttr.engine.serve.sdk_tree import content_digest, sync_tree
    from tttr.recorders.snapshot import snapshot

    src = tmp_path / "recorded"
    (src / "sub").mkdir(parents=True)
    (src / "same.txt").write_text("same\n")
    (src / "changed.txt").write_text("after\n")
    (src / "sub" / "new.txt").write_text("new\n")
    (src / "run.sh").write_text("echo\n")
    os.chmod(src / "run.sh", 0o755)
    os.symlink("same.txt", src / "link")
    (src / "prog.py").write_text("recorded program\n")
    with Store.open(tmp_path / "s.db", create=True) as store:
        manifest = snapshot(src, store)

        tree = tmp_path / "live"
        tree.mkdir()
        (tree / "same.txt").write_text("same\n")
        os.utime(tree / "same.txt", ns=(10**18, 10**18))
        (tree / "changed.txt").write_text("before\n")
        (tree / "gone.txt").write_text("x\n")
        (tree / "gone-dir").mkdir()
        (tree / "run.sh").write_text("echo\n")
        (tree / "prog.py").write_text("edited program\n")
        sync_tree(tree, manifest, store, keep="prog.py")
    assert content_digest(tree, skip="prog.py") == content_digest(src, skip="prog.py")
    assert sorted(p.name for p in tree.iterdir()) == ["changed.txt", "link", "prog.py", "run.sh", "same.txt", "sub"]
    assert (tree / "changed.txt").read_text() == "after\n" and os.readlink(tree / "link") == "same.txt"
    assert os.stat(tree / "run.sh").st_mode & 0o777 == 0o755
    assert os.stat(tree / "same.txt").st_mtime_ns == 10**18  # left alone
    assert (tree / "prog.py").read_text() == "edited program\n"


def test_a_large_output_is_cut_alike_for_program_and_recording_and_stored_as_a_blob(tmp_path, monkeypatch):
    """A real server (its model never loads: the SDK's routes do not need it) and store."""
    from tttr.engine.serve.modes import FromRecording, Live
    from tttr.engine.serve.server import create_app
    from tttr.engine.serve.recorder import CallRecorder
    from tttr.engine.serve.service import Service
    from serve_helpers import Running

    service = Service()
    recorder = CallRecorder(tmp_path / "sdk.db", service)
    running = Running(create_app(Live(service), recorder), lifespan="off")
    try:
        monkeypatch.setenv(sdk.URL_ENV, running.url)
        monkeypatch.setenv(sdk.RUN_ENV, "big")
        cmd = "head -c 1500000 /dev/zero | tr '\\0' y; echo err >&2"
        out = sdk.shell(cmd, timeout=30, cwd=str(tmp_path))
        assert out.truncated and out.stdout == "y" * sdk.MAX_OUTPUT and out.stderr == "err\n"
        recorder.flush()
        store = recorder.store
        run = next(r for r in store.runs() if r.task == "big")
        value = next(e.value for e in store.events(run.id) if e.kind == "tool")
        assert value["truncated"] is True and (value["stdout_size"], value["stderr_size"]) == (1_500_000, 4)
        assert value["stdout"]["size"] == sdk.MAX_OUTPUT and value["stderr"] == "err\n"  # a blob, and inline text

        # Answered from that recording (the replay hook), the program gets the same cut text back.
        recorded = {k: value[k] for k in ("stdout", "stderr", "exit_code", "truncated")}
        replaying = Running(create_app(FromRecording(None, lambda name, kind, asked: recorded, {"id": "tttr"}),
                                       recorder), lifespan="off")
        monkeypatch.setenv(sdk.URL_ENV, replaying.url)
        monkeypatch.setenv(sdk.REPLAY_ENV, "1")
        again = sdk.shell(cmd, timeout=30, cwd=str(tmp_path))
        replaying.stop()
        assert (again.stdout, again.stderr, again.exit_code, again.truncated) == (out.stdout, "err\n", 0, True)
    finally:
        running.stop()
        recorder.close()


@pytest.mark.slow
@needs_sandbox
def test_shell_records_the_tree_replays_as_a_cassette_and_forks(tmp_path, capsys):
    tree = program_tree(tmp_path, "tree", PROGRAM)
    db = tmp_path / "s.db"
    rec = cli_json(capsys, ["record", "--db", str(db), "--tree", str(tree), "--seed", "3", "--json", "--",
                            "python3", "prog.py"])
    assert rec["exit_code"] == 0 and rec["stdout"] == "'made.txt\\nprog.py\\n' 'made\\n' 'made\\n' 0\n", rec
    with Store.open(db, readonly=True) as store:
        first, second = _tools(store, rec["run_id"])
        assert first["cmd"].startswith("echo made") and first["source"] == "sdk"
        assert first["tree_before"] != first["tree_after"] and first["snapshot"]
        assert second["tree_before"] == first["tree_after"]  # nothing else touched the tree between them
        assert {"made.txt", "prog.py"} <= {e.path for e in read_manifest(first["snapshot"], store)}

    # A faithful replay runs neither command, yet the program reads the file the first one wrote.
    res = replay_json(capsys, db, rec["run_id"])
    assert res["identical"] is True and res["tools_run"] == 0 and res["stdout"] == rec["stdout"], res
    assert res["same_tree"] is True  # the second command's `echo more` is put back too

    # An edited program that changes the tree before the second command misses its cassette:
    # the divergence names the tree, and the command runs live on the tree as it now is.
    code = program_tree(tmp_path, "code", PROGRAM.replace("# EDIT", "open('made.txt', 'a').write('edit\\n')"))
    res = replay_json(capsys, db, rec["run_id"], "--code", str(code))
    div = res["divergence"]
    assert div["site"] == "step 1, tool cat made.txt; echo more >> made.txt: tree_before", div
    assert div["recorded"] == second["tree_before"] and div["live"] != div["recorded"]
    assert res["tools_run"] == 1 and "'made\\nedit\\n' 0" in res["stdout"], res

    # A fork at the first command: the program gets the new output, and the recorded effects.
    res = cli_json(capsys, ["fork", str(rec["run_id"]), "--db", str(db), "--at", "0:tool", "--set",
                            '{"stdout": "forked\\n"}', "--json"])
    assert res["forked"] is True and res["exit_code"] == 0, res
    assert res["stdout"].startswith("'forked\\n' 'made\\n' 'made\\n' 0"), res


BIG = textwrap.dedent("""\
    from tttr.recorders import sdk

    out = sdk.shell("head -c 1500000 /dev/zero | tr '\\\\0' y; echo err >&2", timeout=30)
    print(len(out.stdout), out.stdout[:3], repr(out.stderr), out.exit_code, out.truncated)
""")


def test_a_fork_value_at_a_cut_output_keeps_the_truncated_flag_true_to_its_outputs():
    """What a fork gives the SDK and records for a command whose output was cut: the flag and
    both whole sizes follow the outputs it ends up with (recorders/sdk.py's rule)."""
    from tttr.engine.program.fork import _new_tool, _tool_answer

    cut = {"cmd": "big", "cwd": "/work", "timeout_s": 30, "stdout": {"$blob": "ab", "size": sdk.MAX_OUTPUT},
           "stderr": "err\n", "exit_code": 0, "truncated": True, "stdout_size": 1_500_000, "stderr_size": 4}
    kept = _new_tool(cut, {"exit_code": 3})  # the cut stdout stays: still truncated, for the program too
    assert (kept["truncated"], kept["stdout_size"], kept["stderr_size"]) == (True, 1_500_000, 4)
    assert _tool_answer({"cmd": "big"}, kept)["truncated"] is True
    short = _new_tool(cut, {"stdout": "short\n"})  # a new whole stdout in place of the cut one
    assert "truncated" not in short and "stdout_size" not in short and "stderr_size" not in short
    assert not _tool_answer({"cmd": "big"}, short).get("truncated")
    huge = _new_tool({**cut, "truncated": None, "stdout": "x", "stdout_size": None, "stderr_size": None},
                     {"stdout": "é" * sdk.MAX_OUTPUT})  # past MAX_OUTPUT bytes: cut as the SDK cuts
    assert huge["truncated"] is True and (huge["stdout_size"], huge["stderr_size"]) == (2 * sdk.MAX_OUTPUT, 4)
    assert len(huge["stdout"].encode()) == sdk.MAX_OUTPUT
    both = _new_tool({**cut, "stderr_size": 2_000_000}, {"stdout": "short\n"})  # stderr stays cut
    assert (both["truncated"], both["stdout_size"], both["stderr_size"]) == (True, 6, 2_000_000)


@pytest.mark.slow
@needs_sandbox
def test_a_fork_at_a_truncated_shell_output_passes_the_flag_on(tmp_path, capsys):
    tree = program_tree(tmp_path, "tree", BIG)
    db = tmp_path / "s.db"
    rec = cli_json(capsys, ["record", "--db", str(db), "--tree", str(tree), "--json", "--", "python3", "prog.py"])
    assert rec["stdout"] == f"{sdk.MAX_OUTPUT} yyy 'err\\n' 0 True\n", rec
    res = replay_json(capsys, db, rec["run_id"])
    assert res["identical"] is True and res["tools_run"] == 0 and res["stdout"] == rec["stdout"], res

    # Another exit code: the program still gets the cut stdout, and is told so.
    res = cli_json(capsys, ["fork", str(rec["run_id"]), "--db", str(db), "--at", "0:tool", "--set", "exit=3",
                            "--json"])
    assert res["stdout"] == f"{sdk.MAX_OUTPUT} yyy 'err\\n' 3 True\n", res
    # A new, short stdout: whole, so neither the program nor the fork's event says truncated.
    res = cli_json(capsys, ["fork", str(rec["run_id"]), "--db", str(db), "--at", "0:tool", "--set",
                            '{"stdout": "short"}', "--json"])
    assert res["stdout"] == "5 sho 'err\\n' 0 False\n", res
    with Store.open(db, readonly=True) as store:
        (forked,) = _tools(store, res["run_id"])
        assert forked["stdout"] == "short" and "truncated" not in forked and "stdout_size" not in forked, forked
