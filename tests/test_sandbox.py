"""The executor: clock, shell state, limits' bookkeeping, refusal without a sandbox, CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from tttr.recorders import sandbox as sandbox_mod
from tttr.recorders.limits import Limits
from tttr.recorders.sandbox import Executor, SandboxError, ShellState, probe
from tests.sandbox_helpers import CLOCK, needs_sandbox

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ex(tmp_path):
    with Executor(tmp_path, seed=7) as e:
        yield e


@needs_sandbox
def test_clock_is_the_callers_and_runs(ex):
    res = ex.run("date -u +%FT%T; sleep 1.1; date +%s", CLOCK, step=0)
    first, second = res.stdout.split()
    assert first == "2026-03-02T10:00:00"
    # each process starts at the step's clock: the clock runs, but per process
    assert int(second) == int(CLOCK.replace(tzinfo=__import__("datetime").timezone.utc).timestamp())
    res = ex.run("python3 -c 'import datetime; print(datetime.datetime.now().date())'", datetime(2031, 7, 4, 8))
    assert res.stdout.strip() == "2031-07-04"
    assert res.clock == "2031-07-04T08:00:00"


@needs_sandbox
def test_timeouts_inside_the_command_still_work(ex):
    res = ex.run("timeout 1 sleep 5; echo rc=$?", CLOCK)
    assert res.stdout.strip() == "rc=124"
    assert res.duration_ms < 4000


@needs_sandbox
def test_python_sleeps_under_the_virtual_clock(ex):
    # time.sleep() is clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which libfaketime
    # 0.9.10 refuses (EINVAL) when the monotonic clock is real, as it is here
    r = ex.run("python3 -c 'import time; t = time.monotonic(); time.sleep(0.3); print(time.monotonic() - t >= 0.29)'", CLOCK)
    assert (r.exit_code, r.stdout.strip()) == (0, "True"), r.stderr


@needs_sandbox
def test_shell_state_is_carried(ex, tmp_path):
    r1 = ex.run("mkdir -p sub/deeper && cd sub && export GREETING='hi there' COUNT=3", CLOCK, 0, ShellState())
    assert r1.state_after.cwd == "/work/sub"
    assert r1.state_after.exports == {"COUNT": "3", "GREETING": "hi there"}
    r2 = ex.run("pwd; echo \"$GREETING/$COUNT\"; cd deeper; unset COUNT", CLOCK, 1, r1.state_after)
    assert r2.stdout.splitlines() == ["/work/sub", "hi there/3"]
    assert r2.cwd == "/work/sub"
    assert r2.state_after.cwd == "/work/sub/deeper"
    assert r2.state_after.exports == {"GREETING": "hi there"}
    # a cwd that no longer exists falls back to /work
    r3 = ex.run("pwd", CLOCK, 2, ShellState(cwd="/work/gone"))
    assert r3.stdout.strip() == "/work"
    # pinned variables are not carried as exports
    assert "PATH" not in r3.state_after.exports and "TTTR_SEED" not in r3.state_after.exports


@needs_sandbox
def test_exit_code_stderr_and_env(ex):
    res = ex.run("echo out; echo err >&2; exit 3", CLOCK)
    assert (res.stdout, res.stderr, res.exit_code) == ("out\n", "err\n", 3)
    assert res.env["TZ"] == "UTC" and res.env["HOME"] == "/work" and res.env["PYTHONHASHSEED"] == "0"
    assert res.env["SOURCE_DATE_EPOCH"] == "1772445600"
    env = ex.run("env", CLOCK).stdout
    assert "HOSTNAME=sandbox" in env and "/root" not in env


@needs_sandbox
def test_output_cap_marks_truncation(tmp_path):
    with Executor(tmp_path, limits=Limits(output_cap=1000)) as ex:
        res = ex.run("seq 1 10000", CLOCK)
    assert res.truncated and res.stdout_size == len("".join(f"{i}\n" for i in range(1, 10001)))
    assert res.stdout.endswith(f"[output truncated: {res.stdout_size} bytes in total, first 1000 kept]\n")


@needs_sandbox
def test_file_times_are_virtual(ex, tmp_path):
    ex.run("echo hi > a; mkdir d; touch -d '2020-01-01 00:00:00' old", CLOCK)
    st = (tmp_path / "a").stat()
    assert st.st_mtime == CLOCK.replace(tzinfo=__import__("datetime").timezone.utc).timestamp()
    out = ex.run("ls -l --time-style=+%F_%T", CLOCK).stdout
    assert "2026-03-02_10:00:00 a" in out and "2020-01-01_00:00:00 old" in out


@needs_sandbox
def test_mechanisms_are_recorded(ex):
    res = ex.run("true", CLOCK)
    for m in ("bwrap", "pid-ns", "net-ns", "faketime", "timeout", "output-cap"):
        assert m in res.mechanisms
    assert "unsafe-no-sandbox" not in res.mechanisms
    assert json.loads(json.dumps(res.to_json()))["mechanisms"] == list(res.mechanisms)


def _refused(monkeypatch):
    refused = replace(probe(), reason="bubblewrap cannot create namespaces here: Operation not permitted",
                      bwrap=None, namespaces=False)
    monkeypatch.setattr(sandbox_mod, "probe", lambda: refused)
    return refused


def test_refuses_without_sandbox(monkeypatch, tmp_path):
    refused = _refused(monkeypatch)
    assert refused.line().startswith("sandbox: refused (")
    with pytest.raises(SandboxError) as info:
        Executor(tmp_path)
    assert info.value.exit_code == 2
    assert "--unsafe-no-sandbox" in str(info.value) and "\n" not in str(info.value)


def test_unsafe_mode_runs_and_says_so(monkeypatch, tmp_path):
    _refused(monkeypatch)
    with Executor(tmp_path, seed=1, unsafe_no_sandbox=True) as ex:
        r = ex.run("mkdir sub && cd sub && pwd && date +%F", CLOCK)
        assert r.exit_code == 0, r.stderr
        assert "unsafe-no-sandbox" in r.mechanisms and "bwrap" not in r.mechanisms
        assert r.state_after.cwd == "/work/sub"           # recorded in sandbox terms
        assert r.stdout.splitlines()[0] == str(tmp_path.resolve() / "sub")
        if probe().faketime:
            assert r.stdout.splitlines()[1] == "2026-03-02"
        assert ex.run("pwd", CLOCK, 1, r.state_after).stdout.strip() == str(tmp_path.resolve() / "sub")


def test_bad_inputs(tmp_path):
    with pytest.raises(SandboxError):
        Executor(tmp_path / "missing")
    with pytest.raises(SandboxError):
        Limits(timeout_s=0)
    with pytest.raises(SandboxError):
        ShellState(cwd="relative")


@needs_sandbox
def test_cli_exec_prints_the_result(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "tttr.app", "sandbox", "exec", "--clock", "2026-03-02T10:00:00", "--seed", "3",
         "--tree", str(tmp_path), "--", "date +%F; echo $$; exit 4"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert out.returncode == 4, out.stderr  # the command's status, like `timeout` and `docker exec`
    assert "2026-03-02\n2\n" in out.stdout
    for word in ("exit code  4", "duration", "clock      2026-03-02T10:00:00", "mechanisms", "bwrap"):
        assert word in out.stdout
    bad = subprocess.run([sys.executable, "-m", "tttr.app", "sandbox", "exec", "--clock", "yesterday", "--", "true"],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("tttr: error: bad clock 'yesterday'")


def test_exec_words_are_one_argv_and_one_word_is_a_shell_line():
    from tttr.app.commands.sandbox import shell_line

    assert shell_line(["python3", "-c", "print(1)"]) == "python3 -c 'print(1)'"
    assert shell_line(["printf", "%s\\n", "a b", "$HOME", "*", ""]) == "printf '%s\\n' 'a b' '$HOME' '*' ''"
    assert shell_line(["date; ls -l"]) == "date; ls -l"
    assert shell_line(["--", "ls", "-l"]) == "ls -l"  # a second `--` is no command's name
    for words in ([], ["--"], ["  "]):
        with pytest.raises(SandboxError):
            shell_line(words)


@needs_sandbox
def test_cli_exec_runs_an_argv_or_a_shell_line(tmp_path, capsys):
    from tttr.app.cli import main

    exec_ = ["sandbox", "exec", "--tree", str(tmp_path), "--clock", "2026-03-02T10:00:00", "--json", "--"]
    # Several arguments are one argv, as with bwrap, docker run and faketime: each reaches the
    # program as it is, with no shell splitting, globbing or expansion.
    assert main([*exec_, "python3", "-c", "print(1)"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["stdout"], res["stderr"], res["cmd"]) == ("1\n", "", "python3 -c 'print(1)'")
    (tmp_path / "x.txt").write_text("")
    assert main([*exec_, "python3", "-c", "import sys; print(sys.argv[1:])", "a b", "$HOME", "*", ""]) == 0
    assert json.loads(capsys.readouterr().out)["stdout"] == "['a b', '$HOME', '*', '']\n"
    assert main([*exec_, "sh", "-c", "exit 5"]) == 5
    capsys.readouterr()
    # One argument is a shell line, as the agent's commands are.
    assert main([*exec_, "cd /work && echo $((6 * 7)) > f; cat f; date +%F"]) == 0
    assert json.loads(capsys.readouterr().out)["stdout"] == "42\n2026-03-02\n"
    assert main([*exec_, "echo *"]) == 0
    assert "x.txt" in json.loads(capsys.readouterr().out)["stdout"]
    # Without --json the header shows the shell line that ran.
    assert main([*exec_[:-2], "--", "echo", "a  b"]) == 0
    assert capsys.readouterr().out.startswith("$ echo 'a  b'\n--- stdout (5 bytes)\na  b\n")


def test_bash_messages_number_lines_as_a_plain_bash_c(tmp_path):
    """The state-carrying prelude shares the command's line: the agent sees the same error
    text as under `bash -c`, not the prelude's line count."""
    from datetime import datetime

    from tttr.recorders.sandbox import Executor

    with Executor(tmp_path, seed=1) as ex:
        res = ex.run("true\nnosuchcmd_tttr", clock=datetime(2026, 3, 2, 9, 0, 0))
    assert "bash: line 2: nosuchcmd_tttr: command not found" in res.stderr
