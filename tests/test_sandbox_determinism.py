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


# Each value docs/sandbox.md says two sandboxes (or two runs of a recorded program) read alike,
# and where a test checks it: a command of SEQUENCE above, or a read of tests/test_logical_clock.py's
# READS program, which is compared on a busy machine and a quiet one.
COVERED = {
    "date": "date", "ls -l": "ls -l", "find": "find", "ps": "ps", "mktemp -u": "mktemp -u",
    "$RANDOM": "echo $RANDOM $RANDOM", "head -c 8\n/dev/urandom": "head -c 16 /dev/urandom | od -An -tx1",
    "random": "python3 -c 'import random, uuid; print(random.random(), uuid.uuid4())'",
    "uuid4": "python3 -c 'import random, uuid; print(random.random(), uuid.uuid4())'",
    "hostname": "hostname; id; echo $$", "id": "hostname; id; echo $$", "$$": "hostname; id; echo $$",
    "datetime.now()": "READS:datetime.datetime.now()", "time.time()": "READS:time.time()",
    "time.monotonic()": "READS:time.monotonic()",
}


def test_every_value_the_docs_call_the_same_is_checked_by_a_test():
    import re
    from pathlib import Path

    from tests.test_logical_clock import READS

    doc = (Path(__file__).resolve().parent.parent / "docs" / "sandbox.md").read_text()
    claim = doc[doc.index("Two sandboxes with the same clock and seed give"):doc.index("What still varies or")]
    claimed = set(re.findall(r"`([^`]+)`", claim))
    assert claimed == set(COVERED), f"docs/sandbox.md claims {sorted(claimed - set(COVERED))} without a check here"
    for name, check in COVERED.items():
        if check.startswith("READS:"):
            assert check.removeprefix("READS:") in READS, name
        else:
            assert check in SEQUENCE, name
