"""`tttr suite` end to end (issue 17): the default model, the real sandbox, a real SQLite file.
Two runs per condition of one short task with a one-step limit; the runs are stored with
their suite and condition, the pinned conditions replay the task's first free run, and
`tttr stats` reads them with no residual under full pinning."""

from __future__ import annotations

import json

import pytest

from tttr.app.cli import main
from tttr.engine.replay.variance import CONDITIONS
from tttr.sessions.store import Store

pytestmark = pytest.mark.slow  # records and replays real runs of the default model


def test_suite_records_four_conditions_and_stats_reads_them(tmp_path, capsys):
    db = tmp_path / "suite.db"
    assert main(["suite", "--runs", "2", "--tasks", "write-line", "--max-steps", "1", "--db", str(db)]) == 0
    captured = capsys.readouterr()
    assert "[8/8]" in captured.err and "through one engine" in captured.err  # progress per run, batched

    with Store.open(db, readonly=True, create=False) as store:
        runs = [r for r in store.runs() if "suite" in r.meta]
        assert len(runs) == 8 and all(r.status == "complete" for r in runs)
        assert len({r.meta["suite"]["id"] for r in runs}) == 1
        by = {c: [r for r in runs if r.meta["suite"]["condition"] == c] for c in CONDITIONS}
        assert all(len(rs) == 2 for rs in by.values())
        anchor = min(by["free"], key=lambda r: (r.meta["suite"]["index"], r.id))
        replayed = [r for c in ("token-pinned", "trace-pinned", "pinned") for r in by[c]]
        assert all(r.parent == anchor.id and r.meta["suite"]["anchor"] == anchor.id for r in replayed)
        assert all(r.seed == anchor.seed for r in by["token-pinned"] + by["pinned"])
        assert all(r.meta["clock"] == anchor.meta["clock"] for r in by["trace-pinned"] + by["pinned"])
        assert sorted(by["pinned"][0].meta["replay"]["free"]) == ["tensor"]  # the arithmetic recomputed live

    assert main(["stats", "--db", str(db), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    pinned = data["tasks"][0]["conditions"]["pinned"]
    assert data["tasks"][0]["task"] == "write-line" and pinned["pairs"] == 1
    assert pinned["agreement"] == 1.0 and data["residual_ok"] is True


# A `tttr suite` whose engine never finishes a generation unless it is cancelled: every run
# waits in its first message until Ctrl-C. The tokenizer, the tasks and the sandbox are real.
# With $STUCK_CANCEL set, a cancel never returns either: a run that cannot end (as one in a long command).
STUCK_SUITE = """
import os, sys, threading
from concurrent.futures import Future
from tttr.engine.replay.runtime import Runtime

class Stuck:
    prefixes = None
    def __init__(self):
        self.pending = {}
    def submit(self, seq):
        self.pending[id(seq)] = future = Future()
        sys.stderr.write("generating\\n")
        return future
    def cancel(self, seq):
        sys.stderr.write("cancelling\\n")
        if os.environ.get("STUCK_CANCEL"):
            threading.Event().wait()
        self.pending.pop(id(seq)).set_result([])
        return True

stuck = Stuck()
Runtime.engine = property(lambda self: stuck)
from tttr.app.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _interrupt_suite(argv: list[str], *waits: tuple[str, int], env: dict | None = None) -> tuple[int, list[str]]:
    """`python ARGV` (a `tttr suite`) in a process of its own, sent SIGINT once for each of
    `waits` (a text and a count: once stderr has said it that many times); its exit status and
    its stderr lines, less STUCK_SUITE's and the progress lines."""
    import os
    import queue
    import signal
    import subprocess
    import sys
    import threading

    proc = subprocess.Popen([sys.executable, *argv], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            env={**os.environ, **(env or {})})
    lines: queue.SimpleQueue = queue.SimpleQueue()

    def read() -> None:
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        for after, times in waits:
            seen = 0
            while seen < times:
                line = lines.get(timeout=300)  # a hang guard only
                assert line is not None, f"the suite ended before saying {after!r} {times} times: exit {proc.wait()}"
                seen += line.count(after)
            proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)  # a hang guard only: it ends in a second or two
    finally:
        proc.kill()
    err = []
    while (line := lines.get(timeout=30)) is not None:
        line = line.rstrip("\n")
        for said in ("generating", "cancelling"):  # STUCK_SUITE's
            line = line.replace(said, "")
        if line and not line.startswith("["):
            err.append(line)
    return code, err


def _statuses(db) -> dict[int, str]:
    with Store.open(db, readonly=True, create=False) as store:
        return {r.id: r.status for r in store.runs()}


def _stuck_suite(db) -> list[str]:
    return ["-c", STUCK_SUITE, "suite", "--runs", "2", "--tasks", "write-line", "--db", str(db)]


def test_ctrl_c_ends_the_runs_in_the_middle_of_a_generation_at_once(tmp_path):
    """The suite waited for every run in flight to finish its step (a generation, then a
    command); with a slow model it ran on for a minute and a half after Ctrl-C."""
    db = tmp_path / "suite.db"
    code, err = _interrupt_suite(_stuck_suite(db), ("generating", 2))
    assert code == 130, err
    assert len(err) == 1 and err[0].startswith("tttr suite: interrupted;") and "marked incomplete" in err[0], err
    assert _statuses(db) == {1: "incomplete", 2: "incomplete"}


def test_a_second_ctrl_c_stops_waiting_for_runs_that_do_not_end(tmp_path):
    db = tmp_path / "suite.db"
    code, err = _interrupt_suite(_stuck_suite(db), ("generating", 2), ("cancelling", 2), env={"STUCK_CANCEL": "1"})
    assert code == 130 and len(err) == 1 and err[0].startswith("tttr suite: interrupted;"), err
    assert _statuses(db) == {1: "incomplete", 2: "incomplete"}


def test_ctrl_c_keeps_the_finished_runs_and_marks_the_rest_incomplete(tmp_path):
    db = tmp_path / "suite.db"
    code, err = _interrupt_suite(["-m", "tttr.app", "suite", "--runs", "2", "--tasks", "write-line", "--max-steps", "1",
                                  "--db", str(db)], ("[1/8]", 1))
    assert code == 130 and len(err) == 1 and err[0].startswith("tttr suite: interrupted;"), err
    statuses = _statuses(db)
    assert "recording" not in statuses.values() and "complete" in statuses.values(), statuses


def test_an_interrupted_suite_of_a_task_folder_resumes_the_missing_runs(tmp_path):
    """Issue 30: a user's task folder, Ctrl-C after the first run, then `--resume ID`: the
    runs it holds complete are not run again, the missing ones are, and the pinned ones
    replay the anchor it already had."""
    task = tmp_path / "tasks" / "append-done"
    (task / "tree").mkdir(parents=True)
    (task / "tree" / "todo.txt").write_text("buy milk\n")
    (task / "instruction.md").write_text("Append the line done to todo.txt.\n")
    (task / "check.sh").write_text("grep -qx done todo.txt\n")
    db = tmp_path / "suite.db"
    code, err = _interrupt_suite(["-m", "tttr.app", "suite", "--runs", "2", "--tasks-dir", str(tmp_path / "tasks"),
                                  "--max-steps", "1", "--seed", "4", "--label", "mine", "--db", str(db)], ("[1/8]", 1))
    assert code == 130, err
    suite_id = err[0].split("--suite ")[1].rstrip(")")
    before = _statuses(db)
    kept = {i for i, s in before.items() if s == "complete"}
    assert kept and len(kept) < 8
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "tttr.app", "suite", "--resume", suite_id, "--db", str(db)],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    with Store.open(db, readonly=True, create=False) as store:
        runs = [r for r in store.runs() if r.meta["suite"]["id"] == suite_id]
        complete = [r for r in runs if r.status == "complete"]
        slots = {(r.meta["suite"]["condition"], r.meta["suite"]["index"]) for r in complete}
        assert slots == {(c, i) for c in CONDITIONS for i in range(2)} and len(complete) == 8  # none twice
        assert all(r.task == "append-done" and r.meta["suite"]["settings"]["label"] == "mine" for r in runs)
        anchor = min((r for r in complete if r.meta["suite"]["condition"] == "free"),
                     key=lambda r: (r.meta["suite"]["index"], r.id))
        assert all(r.parent == anchor.id for r in complete if r.meta["suite"]["condition"] != "free")
    assert main(["stats", "--db", str(db), "--suite", suite_id]) == 0
