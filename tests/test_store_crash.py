"""A recorder killed with SIGKILL at random moments leaves a database that opens, passes
integrity_check, keeps every committed step, and shows the run as incomplete."""

from __future__ import annotations

import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tttr.sessions.store import Store

ROOT = Path(__file__).resolve().parent.parent
KILLS = 12
POSITIONS = 30

RECORDER = f"""
import os, sys
from tttr.sessions.store import Store
store = Store.open(sys.argv[1])
run = store.begin_run(task="crash", seed=5)
print("run", run, flush=True)
step = 0
while True:
    for pos in range({POSITIONS}):
        store.append(run, f"{{step}}:token:{{pos}}",
                     {{"id": step * 1000 + pos, "text": "x" * (pos % 7), "forced": False, "logprob": -0.5, "rng": [5, step, pos]}})
    if step % 5 == 0:
        blob = store.put_blob(os.urandom(64) * 64)
    store.append(run, f"{{step}}:tool", {{"cmd": "echo " * 50, "step": step, "blob": blob}})
    store.commit_step(run)
    print("committed", step, flush=True)
    step += 1
"""


def expected_step(events, step: int) -> bool:
    tokens = [e.value["id"] for e in events if e.kind == "token"]
    tools = [e.value["step"] for e in events if e.kind == "tool"]
    return tokens == [step * 1000 + p for p in range(POSITIONS)] and tools == [step]


def test_sigkill_at_random_moments_loses_at_most_the_step_in_flight(tmp_path):
    path = tmp_path / "crash.db"
    seed = int(time.time())
    rnd = random.Random(seed)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    recorded = 0
    for kill in range(KILLS):
        proc = subprocess.Popen([sys.executable, "-c", RECORDER, str(path)], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        first = ""
        if kill % 2:  # from the start: start-up, open, migration, or the first steps
            time.sleep(rnd.uniform(0.02, 0.6))
        else:  # once recording: anywhere in a step, in a commit, in a blob write
            first = proc.stdout.readline()
            time.sleep(rnd.uniform(0.0, 0.25))
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        lines = (first + out).split("\n")
        where = f"kill {kill} (random seed {seed}), recorder said {lines[-3:]!r}"
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)], where
        conn.close()
        # a kill can cut the recorder's last line short: only whole lines are promises
        runs = [m[1] for m in map(re.compile(r"run (\d+)").fullmatch, lines[:-1]) if m]
        committed = [int(m[1]) for m in map(re.compile(r"committed (\d+)").fullmatch, lines[:-1]) if m]
        if not runs:
            continue  # killed before the run began: nothing was promised
        with Store.open(path, readonly=True) as store:
            rid = int(runs[0])
            assert store.run(rid).status == "incomplete", where
            last = committed[-1] if committed else -1
            for step in range(last + 1):
                assert expected_step(store.events(rid, step=step), step), f"step {step} damaged; {where}"
            in_flight = store.events(rid, step=last + 1)
            assert not in_flight or expected_step(in_flight, last + 1), where  # committed before the print, or absent
            assert store.steps(rid) in (last + 1, last + 2), where
            recorded += last + 1
    with Store.open(path) as store:  # and a writer can carry on with the file
        rid = store.begin_run(task="after")
        store.append(rid, "0:clock", {"t": "x"})
        store.finish_run(rid)
        assert store.run(rid).status == "complete"
        assert all(r.status == "incomplete" for r in store.runs()[:-1])
    assert recorded > 0, "no kill landed after a commit; the test did not test anything"
