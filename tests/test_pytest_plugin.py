"""TTTR's pytest plugin (engine/program/pytest_plugin.py, issue 32), run as a user runs it: a
real pytest process over assets/examples/test_openai_agent_replay.py and a test file of our
own, against a real recording of assets/examples/openai_agent.py. The example that keeps the
program passes; the one that changes a line of its prompt fails with the divergence; a marker
naming a run the database lacks is an error, not a failure."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandbox_helpers import needs_sandbox
from tests.program_helpers import record_program

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "assets" / "examples"


def _pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    from importlib.metadata import entry_points

    # -p names the plugin where the checkout's editable install predates its pytest11 entry point
    installed = any(e.value == "tttr.engine.program.pytest_plugin" for e in entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "tttr.engine.program.pytest_plugin"]
    return subprocess.run([sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider", "-q", "-rA", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=600)


def _counts(out: str) -> dict[str, int]:
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?)", out.splitlines()[-1])}


@pytest.mark.slow
@needs_sandbox
def test_the_plugin_replays_marked_tests_sealed_against_todays_code(tmp_path, capsys):
    tree = tmp_path / "work"
    tree.mkdir()
    (tree / "README").write_text("greeting.txt should say hello world\n")
    shutil.copy(EXAMPLES / "openai_agent.py", tree)
    shutil.copy(ROOT / "assets" / "tasks" / "write-line" / "check.sh", tree)
    db = tmp_path / "agent.db"
    rec = record_program(capsys, db, tree, "--check", "sh check.sh", program=("python3", "openai_agent.py"))
    assert rec["run_id"] == 1 and rec["passed"] is True, rec["stderr"]

    # The shipped example: one test passes, the one-line prompt change fails with the divergence.
    out = _pytest(str(EXAMPLES / "test_openai_agent_replay.py"), "--tttr-db", str(db), "--basetemp",
                  str(tmp_path / "bt"), cwd=tmp_path)
    text = out.stdout + out.stderr
    assert _counts(out.stdout) == {"passed": 1, "failed": 1}, text
    assert "PASSED" in text and "test_the_agent_still_decides_as_recorded" in text
    failure = text[text.index("test_a_one_line_prompt_change_fails"):]
    assert "does not replay run 1" in failure and "messages[0].content" in failure, text
    assert "What is the file name?" in failure and "Which file?" in failure

    # A marker alone replays before the body; a run the database lacks is the test's error.
    mine = tmp_path / "mine"
    (mine / "agent").mkdir(parents=True)
    shutil.copy(EXAMPLES / "openai_agent.py", mine / "agent")
    (mine / "test_mine.py").write_text(textwrap.dedent("""\
        from pathlib import Path

        import pytest

        @pytest.mark.tttr(run=1, code=Path(__file__).parent / "agent", program=["python3", "openai_agent.py"])
        def test_marked(tttr_replay):
            assert tttr_replay.result.identical

        @pytest.mark.tttr(run=99)
        def test_no_such_run():
            pass
    """))
    before = db.read_bytes()
    out = _pytest("test_mine.py", "--tttr-db", str(db), cwd=mine)
    assert _counts(out.stdout) == {"passed": 1, "error": 1}, out.stdout + out.stderr
    assert "run 99 is not in" in out.stdout

    # Without --tttr-db a marked test cannot run: an error that says what to give.
    out = _pytest("test_mine.py", "-k", "marked", cwd=mine)
    assert _counts(out.stdout) == {"error": 1} and "--tttr-db" in out.stdout
    assert len(db.read_bytes()) >= len(before)  # replays add runs; nothing else wrote

    # --tttr-record: the program recorded anew (the model loads), then replayed against that.
    out = _pytest("test_mine.py", "-k", "marked", "--tttr-db", str(db), "--tttr-record", cwd=mine)
    assert _counts(out.stdout) == {"passed": 1}, out.stdout + out.stderr
    found = re.search(r"run 1 re-recorded as run (\d+)", out.stdout)
    assert found and int(found.group(1)) > 1, out.stdout


@pytest.mark.slow
def test_an_agent_function_in_the_test_process_replays_sealed(tmp_path):
    """An agent *function* (assets/examples/greeting_agent.py) called in the test's body, and the
    official `anthropic` client streaming: --tttr-record records their calls with the default model
    as the runs their markers name; a plain run answers them from those runs through the plugin's
    in-process server, sealed."""
    db = tmp_path / "greeting.db"
    example = str(EXAMPLES / "test_greeting_agent_replay.py")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "test_claude.py").write_text(textwrap.dedent("""\
        import anthropic
        import pytest


        @pytest.mark.tttr(name="claude-greeting")
        def test_the_anthropic_client_streams(tttr_replay):
            client = anthropic.Anthropic()  # ANTHROPIC_BASE_URL is the plugin's server
            with client.messages.stream(model="claude-haiku-4-5", max_tokens=8, system="Reply with one word.",
                                        messages=[{"role": "user", "content": "Say hello."}],
                                        extra_body={"temperature": 0}) as stream:
                print("answer:", repr(stream.get_final_text()))
            if tttr_replay.cassette is not None:  # replaying: answered from the run, sealed
                assert tttr_replay.cassette.answered == 1
    """))
    out = _pytest(example, str(mine / "test_claude.py"), "--tttr-db", str(db), "--tttr-record", "-k",
                  "still_decides or anthropic", cwd=tmp_path)
    assert _counts(out.stdout) == {"passed": 2}, out.stdout + out.stderr
    assert "the test's calls recorded as run 1 (name 'greeting')" in out.stdout
    assert "the test's calls recorded as run 2 (name 'claude-greeting')" in out.stdout
    answer = re.search(r"answer: '.+'", out.stdout)
    assert answer, out.stdout

    # The shipped pair: the same function passes; a one-line prompt change fails with the divergence.
    before = db.read_bytes()
    out = _pytest(example, "--tttr-db", str(db), cwd=tmp_path)
    text = out.stdout + out.stderr
    assert _counts(out.stdout) == {"passed": 1, "failed": 1}, text
    failure = text[text.index("_ test_a_one_line_prompt_change_fails _"):]
    assert "the test's calls do not replay run 1 (greeting): call 0 (step 1), message 0" in failure, failure
    assert "at 1:prompt, messages[0].content:" in failure
    assert "What is the file name?" in failure and "Which file?" in failure
    assert "UnprocessableEntityError" in failure  # what the body's client got, after the cause
    assert db.read_bytes() == before  # sealed: nothing written

    shutil.copy(EXAMPLES / "greeting_agent.py", mine)
    (mine / "test_mine.py").write_text(textwrap.dedent("""\
        import os

        import pytest
        from openai import OpenAI

        import greeting_agent


        @pytest.fixture
        def folder(tmp_path, monkeypatch):
            (tmp_path / "greeting.txt").write_text("here already\\n")  # unlike the recording's folder
            monkeypatch.chdir(tmp_path)


        @pytest.mark.tttr(run=1)
        def test_tools_are_answered_not_run(tttr_replay, folder):
            assert os.environ["OPENAI_BASE_URL"] == tttr_replay.base_url
            plan = greeting_agent.plan_greeting(OpenAI())  # list_files answered as recorded: README only
            assert plan["file"] == "greeting.txt" and tttr_replay.cassette.answered == 3


        @pytest.mark.tttr(name="greeting")
        def test_fewer_calls_than_recorded(tttr_replay, folder):
            greeting_agent.list_files()
            greeting_agent.ask(OpenAI(), "Task: " + greeting_agent.TASK + "\\nFiles here: README\\n"
                               + greeting_agent.ASKED)


        @pytest.mark.tttr(name="greeting")
        def test_a_swallowed_error_still_fails(tttr_replay, folder):
            try:
                greeting_agent.ask(OpenAI(), "something else")
            except Exception:
                pass


        @pytest.mark.tttr(name="no-such-name")
        def test_no_such_name(tttr_replay):
            pass
    """))
    out = _pytest("test_mine.py", "test_claude.py", "--tttr-db", str(db), cwd=mine)
    text = out.stdout + out.stderr
    assert _counts(out.stdout) == {"passed": 2, "failed": 2, "error": 1}, text
    assert "PASSED test_mine.py::test_tools_are_answered_not_run" in text
    assert "PASSED test_claude.py::test_the_anthropic_client_streams" in text
    assert answer.group(0) in text  # the streamed answer, as recorded
    assert "(the test made 1 of the 2 recorded model calls)" in text  # the second call was never asked
    swallowed = text[text.index("_ test_a_swallowed_error_still_fails _"):]
    assert "call 0 (step 1), message 0" in swallowed and "'something else'" in swallowed
    assert "no complete run named 'no-such-name'" in text
    assert db.read_bytes() == before


def _call_step(step: int, content: str, answer: str):
    from tttr.engine.program.replay import _Event, _Step

    request = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return _Step(step, "call", [_Event("prompt", {"endpoint": "chat", "request": request}, f"{step}:prompt"),
                                _Event("message", {"text": answer, "finish_reason": "stop"}, f"{step}:message")])


def test_the_cassette_answers_a_multiset_per_request():
    """A request gets the first recorded answer to an equal request not yet given: repeated
    requests get theirs in recorded order, calls asked in another order still match; the first
    that none answers is the divergence (and every later one is refused); unasked steps are reported."""
    from types import SimpleNamespace

    from tttr.engine.program.in_process import Cassette
    from tttr.engine.serve.errors import APIError

    run = SimpleNamespace(id=1, model_id="m", task="t")
    steps = [_call_step(0, "a", "first a"), _call_step(1, "b", "b"), _call_step(2, "a", "second a")]

    def ask(cassette, content):
        answer = cassette.answer_call(None, "chat", {"model": "m", "messages": [{"role": "user", "content": content}]})
        return answer if isinstance(answer, APIError) else answer["choices"][0]["message"]["content"]

    c = Cassette(run, steps)
    assert [ask(c, "b"), ask(c, "a"), ask(c, "a")] == ["b", "first a", "second a"]
    c.finish()
    assert c.divergence is None and c.answered == 3

    c = Cassette(run, steps)
    assert ask(c, "a") == "first a"
    miss = ask(c, "c")
    assert isinstance(miss, APIError) and miss.status == 422 and miss.code == "sealed_replay_miss"
    assert c.detail == {"call": 1, "step": 1, "at": "1:prompt", "field": "messages[0].content",
                        "recorded": "b", "requested": "c"}
    assert isinstance(ask(c, "b"), APIError)  # sealed after the divergence: nothing more is answered

    c = Cassette(run, steps)
    ask(c, "a")
    c.finish()  # the test ended before asking b and the second a
    assert c.detail["step"] == 1 and "the test made 1 of the 3 recorded model calls" in c.divergence.site


def test_a_marker_the_plugin_cannot_replay_is_the_tests_error(tmp_path):
    """Bad markers and a name the database lacks: errors found while the test is set up, one
    line each, the database untouched."""
    from tttr.sessions.store import Store

    db = tmp_path / "empty.db"
    Store.open(db).close()
    before = db.read_bytes()
    (tmp_path / "test_bad.py").write_text(textwrap.dedent("""\
        import pytest

        @pytest.mark.tttr(name="absent")
        def test_absent(tttr_replay):
            pass

        @pytest.mark.tttr(name="absent", code=".")
        def test_name_with_code(tttr_replay):
            pass

        @pytest.mark.tttr(run="7")
        def test_run_as_text(tttr_replay):
            pass

        @pytest.mark.tttr()
        def test_nothing_named(tttr_replay):
            pass

        @pytest.mark.tttr(name="absent", seed=3)
        def test_unknown_argument(tttr_replay):
            pass
    """))
    out = _pytest("test_bad.py", "--tttr-db", str(db), cwd=tmp_path)
    text = out.stdout
    assert _counts(text) == {"errors": 5}, text + out.stderr
    for line in ("no complete run named 'absent'", "code and program are for a recorded program's run=N",
                 "needs run=N (a run id), not '7'", "needs run=N (a run id) or name=NAME",
                 "takes run, name, code and program, not seed"):
        assert line in text, line
    assert db.read_bytes() == before
