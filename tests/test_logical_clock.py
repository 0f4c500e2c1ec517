"""The logical clock (Executor(logical_clock=True), recorded programs and their replays):
every clock read depends only on what the program did, never on how long it took, so a
program on a machine kept busy reads what it reads on a quiet one; sleeps and timeouts
still wait in real time and move the clock by what they asked for."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest

from tttr.recorders.clock import clock_epoch
from tttr.recorders.program import HostPython
from tttr.recorders.sandbox import Executor
from tests.program_helpers import program_tree, record_program, replay_json
from tests.sandbox_helpers import CLOCK, needs_sandbox

HOST = HostPython.current()
PYTHON = f"{HOST.bin_dir}/python3"
START = clock_epoch(CLOCK)

READS = textwrap.dedent("""\
    import datetime, subprocess, time
    print(datetime.datetime.now().isoformat(), time.time(), time.monotonic())
    import asyncio, email.mime.text, json, xml.dom.minidom  # real time that varies with load
    print(datetime.datetime.now().isoformat(), time.time_ns(), time.monotonic_ns())
    total = sum(i * i for i in range(300_000))
    print(datetime.datetime.now().isoformat(), time.time(), time.monotonic())
    print(subprocess.run(["date", "+%s.%N"], capture_output=True, text=True).stdout.strip())
    print(datetime.datetime.now().isoformat())
""")


@contextlib.contextmanager
def busy_cores():
    """A busy loop on every core (two at least) for the block's length, two minutes at most."""
    loop = "import time\nend = time.monotonic() + 120\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(max(2, os.cpu_count() or 2))]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _run(tree: Path, source: str, logical: bool = True, command: str | None = None, clock: datetime = CLOCK):
    (tree / "prog.py").write_text(source)
    with Executor(tree, seed=3, logical_clock=logical, binds=tuple((d, d) for d in HOST.dirs)) as ex:
        res = ex.run(command or f"{PYTHON} prog.py", clock)
    assert res.exit_code == 0, res.stderr
    return res


def _measured(tree: Path, body: str) -> dict:
    """Run `body` (Python statements) timed: {"real": s of real time (os.times, which no
    shim answers), "mono": s the monotonic clock moved, "wall": s time.time() moved,
    "result": repr of `result`}."""
    source = ("import json, os, time\nr0, m0, w0 = os.times().elapsed, time.monotonic(), time.time()\n"
              f"result = None\n{body}\n"
              'print(json.dumps({"real": os.times().elapsed - r0, "mono": time.monotonic() - m0,'
              ' "wall": time.time() - w0, "result": repr(result)}))\n')
    return json.loads(_run(tree, source).stdout)


@needs_sandbox
def test_reads_are_the_same_on_a_busy_machine_and_start_at_the_steps_clock(tmp_path):
    quiet = _run(tmp_path, READS)
    with busy_cores():
        busy = _run(tmp_path, READS)
    assert busy.stdout == quiet.stdout
    lines = quiet.stdout.splitlines()
    assert lines[0].startswith("2026-03-02T10:00:00.") and lines[-1].startswith("2026-03-02T10:00:00.")
    first_wall, first_mono = map(float, lines[0].split()[1:])
    assert START <= first_wall < START + 0.1
    assert START < float(lines[3]) < START + 0.1  # `date` in a child continues from its parent
    assert "logical-clock" in quiet.mechanisms


@needs_sandbox
def test_sleep_really_waits_and_moves_both_clocks(tmp_path):
    m = _measured(tmp_path, "time.sleep(0.3)")
    assert m["real"] >= 0.29  # os.times() counts in 10 ms ticks
    for clock in ("mono", "wall"):
        assert 0.3 <= m[clock] < 0.301, m


@pytest.mark.parametrize("body, result", [
    ("import asyncio\nasyncio.run(asyncio.sleep(0.2))", "None"),
    ("import threading\nresult = threading.Event().wait(0.2)", "False"),
    ("import queue\ntry:\n    queue.Queue().get(timeout=0.2)\nexcept queue.Empty:\n    result = 'Empty'", "'Empty'"),
    ("import threading\nlock = threading.Lock(); lock.acquire()\nresult = lock.acquire(timeout=0.2)", "False"),
    ("import select\nresult = select.select([], [], [], 0.2)", "([], [], [])"),
    ("import socket\na, b = socket.socketpair(); a.settimeout(0.2)\ntry:\n    a.recv(1)\n"
     "except TimeoutError:\n    result = 'TimeoutError'", "'TimeoutError'"),
])
@needs_sandbox
def test_a_wait_with_a_timeout_times_out_in_real_time(tmp_path, body, result):
    m = _measured(tmp_path, body)
    assert m["result"] == result
    assert 0.18 <= m["real"] < 2.0, m   # neither at once nor forever
    assert 0.2 <= m["mono"] < 0.21 and 0.2 <= m["wall"] < 0.21, m


@needs_sandbox
def test_a_subprocess_timeout_expires(tmp_path):
    body = ("import subprocess\ntry:\n    subprocess.run(['sleep', '5'], timeout=0.3)\n"
            "except subprocess.TimeoutExpired:\n    result = 'TimeoutExpired'")
    m = _measured(tmp_path, body)
    assert m["result"] == "'TimeoutExpired'"
    assert 0.28 <= m["real"] < 3.0 and 0.3 <= m["mono"] < 0.4, m


@needs_sandbox
def test_a_child_continues_its_parents_clock(tmp_path):
    source = textwrap.dedent(f"""\
        import subprocess, time
        time.sleep(0.5)
        parent = time.time()
        print(parent)
        print(subprocess.run(["date", "+%s.%N"], capture_output=True, text=True).stdout.strip())
        print(subprocess.run([{PYTHON!r}, "-c", "import time; print(time.time())"],
                             capture_output=True, text=True).stdout.strip())
    """)
    parent, date, python = map(float, _run(tmp_path, source).stdout.split())
    assert START + 0.5 <= parent < START + 0.6
    assert parent < date < parent + 0.1 and parent < python < parent + 0.1


@needs_sandbox
def test_without_it_the_clock_runs_in_real_time(tmp_path):
    spin = "import os, time\nw = time.time(); end = os.times().elapsed + 0.2\nwhile os.times().elapsed < end: pass\n" \
           "print(time.time() - w)"
    res = _run(tmp_path, spin, logical=False, command=f"date; {PYTHON} prog.py")
    date, moved = res.stdout.splitlines()
    assert date == "Mon Mar  2 10:00:00 UTC 2026"
    assert float(moved) >= 0.15  # libfaketime's clock: real time passes
    assert "logical-clock" not in res.mechanisms and "TTTR_LOGICAL_CLOCK" not in res.env
    assert float(_run(tmp_path, spin).stdout) < 0.1  # the logical one moves with reads only


@needs_sandbox
def test_a_clock_past_2262_reads_and_waits(tmp_path):
    """Past what 64-bit nanoseconds since 1970 hold (and so past what Python's own clock
    functions return): `date` in a child reads it, after its parent waited."""
    source = textwrap.dedent("""\
        import subprocess, threading
        date = ["date", "+%Y-%m-%dT%H:%M:%S.%N"]
        print(subprocess.run(date, capture_output=True, text=True).stdout.strip())
        threading.Event().wait(0.1)
        print(subprocess.run(date, capture_output=True, text=True).stdout.strip())
    """)
    first, second = _run(tmp_path, source, clock=datetime(2999, 12, 31, 23, 59, 59)).stdout.split()
    assert first.startswith("2999-12-31T23:59:59.00") and second.startswith("2999-12-31T23:59:59.10"), (first, second)


@pytest.mark.slow
@needs_sandbox
def test_a_recorded_program_replays_identically_on_a_busy_machine(tmp_path, capsys):
    source = "import datetime, json, asyncio\nprint(datetime.datetime.now().isoformat())\n"
    tree, db = program_tree(tmp_path, "tree", source), tmp_path / "s.db"
    rec = record_program(capsys, db, tree)
    assert rec["exit_code"] == 0 and rec["stdout"].startswith("2026-03-02T10:00:00."), rec
    with busy_cores():
        res = replay_json(capsys, db, rec["run_id"])
    assert res["identical"] is True, res
    assert res["stdout"] == rec["stdout"]
