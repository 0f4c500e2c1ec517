"""Same commands, same clock, same seed, two fresh sandboxes: byte-identical output."""

from __future__ import annotations

from tttr.recorders.sandbox import Executor, ShellState
from tests.sandbox_helpers import CLOCK, needs_sandbox

SEQUENCE = [
    "mkdir -p logs data && echo one > logs/a.log && echo two > data/b.txt && touch empty",
    "date",
    "ls -l",
    "ls -la logs",
    "find",
    "ps",
    "mktemp -u",
    "echo $RANDOM $RANDOM",
    "bash -c 'echo $RANDOM'",
    "echo $SRANDOM",
    "head -c 16 /dev/urandom | od -An -tx1",
    "python3 -c 'import random, uuid; print(random.random(), uuid.uuid4())'",
    "python3 -c 'print({\"alpha\", \"beta\", \"gamma\", \"delta\"})'",
    "mkdir -p /tmp/x && echo private > /tmp/x/f && ls /tmp /tmp/x",
    "hostname; id; echo $$",
]


def _run(tmp, seed):
    outs = []
    with Executor(tmp, seed=seed) as ex:
        state = ShellState()
        for step, cmd in enumerate(SEQUENCE):
            res = ex.run(cmd, CLOCK, step=step, state=state)
            assert res.exit_code == 0, (cmd, res.stderr)
            outs.append(res.stdout)
            state = res.state_after
    return outs


@needs_sandbox
def test_two_fresh_sandboxes_agree_byte_for_byte(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _run(tmp_path / "a", seed=11)
    b = _run(tmp_path / "b", seed=11)
    for cmd, x, y in zip(SEQUENCE, a, b):
        assert x == y, f"{cmd!r} differs:\n{x}\n---\n{y}"
    assert "Mon Mar  2 10:00:00 UTC 2026" in a[1]


@needs_sandbox
def test_seed_and_step_change_the_randomness(tmp_path):
    with Executor(tmp_path, seed=1) as e1, Executor(tmp_path, seed=2) as e2:
        cmd = ("echo $RANDOM $SRANDOM; mktemp -u; python3 -c 'import uuid; print(uuid.uuid4())'; "
               "head -c 8 /dev/urandom | od -An -tx8")
        s1a = e1.run(cmd, CLOCK, step=0).stdout
        s1b = e1.run(cmd, CLOCK, step=0).stdout
        s1c = e1.run(cmd, CLOCK, step=1).stdout
        s2a = e2.run(cmd, CLOCK, step=0).stdout
    assert s1a == s1b
    assert all(x != y for x, y in zip(s1a.split(), s1c.split()))
    assert all(x != y for x, y in zip(s1a.split(), s2a.split()))


@needs_sandbox
def test_two_processes_of_one_command_draw_differently(tmp_path):
    with Executor(tmp_path, seed=5) as ex:
        out = ex.run("mktemp -u; mktemp -u", CLOCK).stdout.split()
    assert len(out) == 2 and out[0] != out[1]
