"""A recorded program's own clock reads as sites (issue 27): the clock the program read before
each model call is `STEP:clock`, recorded before the call's prompt; a replay reads the same
values on a busy machine and compares them call by call; `tttr fork RUN --at N:clock --set
+1d` moves every realtime read from that point on (not the ones before, not sleeps); `tttr
diff` names the moved read as the first cause, before the logits it changed."""

from __future__ import annotations

import os
import textwrap
from datetime import datetime, timedelta

import pytest

from tttr.engine.replay.diff import clock_first_steps, consumed_order
from tttr.recorders.logicalclock import ClockShare
from tttr.sessions.store import Store
from sandbox_helpers import needs_sandbox
from tests.program_helpers import cli_json, program_tree, record_program, replay_json
from tests.test_logical_clock import busy_cores

PROGRAM = textwrap.dedent("""\
    import time
    from datetime import datetime
    from openai import OpenAI

    client = OpenAI()
    model = client.models.list().data[0].id
    for i in range(3):
        now = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        client.chat.completions.create(model=model, max_tokens=2, seed=3,
                                       messages=[{"role": "user", "content": f"It is {now}. Say hi"}])
        print(f"call {i}: {now}")
        t0 = time.monotonic()
        time.sleep(0.3)  # a sleep still waits, and moves the clock by what it asked
        print(f"slept {i}: {time.monotonic() - t0:.3f}")
""")


def _prompts(store, run_id: int) -> dict[int, str]:
    _, events = store.load_run(run_id)
    return {e.step: e.value["request"]["messages"][0]["content"] for e in events if e.kind == "prompt"}


@pytest.mark.slow
@needs_sandbox
def test_a_programs_clock_reads_are_sites_that_replay_fork_and_diff_use(tmp_path, capsys):
    db = tmp_path / "s.db"
    rec = record_program(capsys, db, program_tree(tmp_path, "tree", PROGRAM))
    assert rec["exit_code"] == 0 and rec["calls"] == 3, rec["stderr"]
    assert "call 0: 2026-03-02 10:00:00" in rec["stdout"] and "slept 2: 0.300" in rec["stdout"]
    run = rec["run_id"]
    with Store.open(db, readonly=True) as store:
        _, events = store.load_run(run)
        kinds = [(e.site, e.kind) for e in events if e.step in (0, 1) and e.kind in ("clock", "prompt")]
        reads = [datetime.fromisoformat(e.value["t"]) for e in events if e.kind == "clock" and e.step >= 0]
    assert kinds == [("0:clock", "clock"), ("0:prompt", "prompt"), ("1:clock", "clock"), ("1:prompt", "prompt")]
    assert len(reads) == 3 and reads == sorted(reads)
    assert timedelta(seconds=0.3) < reads[1] - reads[0] < timedelta(seconds=0.31)  # the sleep, not the load

    # A faithful replay while both cores are kept busy reads the same clock before every call.
    with busy_cores():
        replay = replay_json(capsys, db, run)
    assert replay["identical"] is True and replay["divergence"] is None, replay

    # The read before call 1 a day later: call 0's prompt as recorded, calls 1 and 2 a day on.
    fork = cli_json(capsys, ["fork", str(run), "--db", str(db), "--at", "1:clock", "--set", "+1d", "--json"])
    assert fork["forked"] is True, fork
    assert "message 0" in fork["divergence"]["site"] and "call 1" in fork["divergence"]["site"], fork
    assert "call 0: 2026-03-02 10:00:00" in fork["stdout"] and "call 1: 2026-03-03 10:00:00" in fork["stdout"]
    assert "call 2: 2026-03-03 10:00:00" in fork["stdout"] and "slept 1: 0.300" in fork["stdout"]
    with Store.open(db, readonly=True) as store:
        was, now = _prompts(store, run), _prompts(store, fork["run_id"])
        _, forked = store.load_run(fork["run_id"])
    assert now[0] == was[0] and now[1] == was[1].replace("2026-03-02", "2026-03-03") != was[1]
    assert now[2] == was[2].replace("2026-03-02", "2026-03-03")
    moved = [datetime.fromisoformat(e.value["t"]) for e in forked if e.kind == "clock" and e.step >= 0]
    assert moved == [reads[0], reads[1] + timedelta(days=1), reads[2] + timedelta(days=1)]

    # diff names the moved read first, before the logits it changed.
    diff = cli_json(capsys, ["diff", "--db", str(db), str(run), str(fork["run_id"]), "--json"])
    assert diff["first_cause"]["site"] == "1:clock", diff["first_cause"]
    assert diff["first_divergence"]["tensor"]["site"].startswith("1:logits:")

    # The fork replays identically: its recorded offset is applied again.
    again = replay_json(capsys, db, fork["run_id"])
    assert again["identical"] is True, again


@pytest.mark.slow
@needs_sandbox
def test_replay_reports_a_changed_clock_read_first(tmp_path, capsys):
    db = tmp_path / "s.db"
    rec = record_program(capsys, db, program_tree(tmp_path, "tree", PROGRAM))
    assert rec["calls"] == 3, rec["stderr"]
    # Today's code sleeps a second longer after call 0: the clock it reads before call 1 is
    # later, and so is the time in that call's prompt. The read is named, not the prompt.
    code = tmp_path / "code"
    code.mkdir()
    (code / "prog.py").write_text(PROGRAM.replace("time.sleep(0.3)", "time.sleep(0.3 if i != 0 else 1.3)"))
    res = replay_json(capsys, db, rec["run_id"], "--code", str(code))
    assert res["identical"] is False
    assert res["divergence"]["site"].startswith("1:clock"), res["divergence"]
    assert res["divergence"]["recorded"].startswith("2026-03-02T10:00:00.3")
    assert res["divergence"]["live"].startswith("2026-03-02T10:00:01.3")


def test_the_clock_share_reads_what_the_program_wrote_and_nothing_else(tmp_path):
    share = ClockShare(tmp_path / "clock")
    try:
        assert share.bind() == (str(tmp_path / "clock"), "/run/tttr-clock", "rw")
        assert share.event() is None  # no read yet
        fd = os.open(share.path, os.O_RDWR)
        us = int((datetime(2026, 3, 2, 10, 0, 0, 15) - datetime(1970, 1, 1)) / timedelta(microseconds=1))
        os.pwrite(fd, us.to_bytes(8, "little", signed=True), 8)
        assert share.event() == {"t": "2026-03-02T10:00:00.000015", "source": "program"}
        assert share.event() is None  # taken: the next call read nothing since
        share.set_offset(timedelta(days=1, seconds=0.5))
        assert share.offset == timedelta(days=1, seconds=0.5)
        os.pwrite(fd, (us + 1).to_bytes(8, "little", signed=True), 8)
        assert share.event() == {"t": "2026-03-02T10:00:00.000016", "source": "program", "offset_s": 86400.5}
        for junk in (2**63 - 1, -5):  # the program's to write: out of the calendar reads as no read
            os.pwrite(fd, junk.to_bytes(8, "little", signed=True), 8)
            assert share.current() is None
        os.ftruncate(fd, 3)
        assert share.current() is None and share.offset == timedelta(0)
        os.close(fd)
    finally:
        share.close()


def test_a_programs_clock_read_comes_before_its_call_in_the_order_consumed():
    class E:
        def __init__(self, seq, step, kind):
            self.seq, self.step, self.kind = seq, step, kind

    program = [E(2, 0, "clock"), E(3, 0, "prompt"), E(4, 1, "prompt"), E(5, 1, "clock")]
    steps = clock_first_steps(program)
    assert steps == frozenset({0})
    assert consumed_order("0:clock", steps) < consumed_order("0:logits:0", steps) < consumed_order("1:clock", steps)
    assert consumed_order("1:logits:0") < consumed_order("1:clock")  # an agent reads a step's clock after its message


def test_a_recording_without_program_clock_reads_is_not_compared_on_them():
    """A run recorded before programs' clock reads were recorded replays as before; one with
    them is compared read by read (a unit test of the replayer's comparison, its clock a stub)."""
    from types import SimpleNamespace

    from tttr.engine.program.replay import Replayer, _Event, _Recording, _Step

    class Clock:  # what the program read before the call, as ClockShare.current() gives it
        def current(self):
            return {"t": "2026-03-02T10:00:00.000009", "source": "program"}

    def replayer(events) -> Replayer:
        rec = _Recording(SimpleNamespace(model_id="m"), {}, [_Step(0, "call", events)], {}, None)
        r = Replayer(rec, recorder=None, name="program:x")
        r.clock = Clock()
        return r

    prompt = _Event("prompt", {"request": {}}, "0:prompt")
    old = replayer([prompt])
    old._clock_at(old.rec.steps[0], 0)
    assert old.clock_divergence is None
    new = replayer([_Event("clock", {"t": "2026-03-02T10:00:00.000005", "source": "program"}, "0:clock"), prompt])
    new._clock_at(new.rec.steps[0], 0)
    assert new.clock_divergence is not None and new.clock_divergence.site.startswith("0:clock")
    assert (new.clock_divergence.a, new.clock_divergence.b) == ("2026-03-02T10:00:00.000005", "2026-03-02T10:00:00.000009")
