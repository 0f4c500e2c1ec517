"""`tttr bench fidelity`: faithful replays under CPU load, the world's reuse, and the rate at
which a live re-run in the same state answers otherwise. Its figures are measured, not
asserted against targets here; what must hold is their meaning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tttr.app.cli import main
from sandbox_helpers import needs_sandbox

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@needs_sandbox
def test_bench_fidelity_replays_under_load_and_counts_the_worlds_answers():
    out = subprocess.run([sys.executable, "-m", "tttr.app", "bench", "fidelity", "--replays", "2", "--load", "2",
                          "--examples", "openai_agent.py", "--tasks", "write-line", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["load_processes"] == 2 and r["replays_each"] == 2
    assert r["program_identical"].endswith("/2") and r["task_identical"].endswith("/2")
    assert 0.0 <= r["identical_fraction"] <= 1.0
    # Two identical forks: the second asks every question the first asked, in the same states.
    assert r["off_record_commands"] >= 2 and r["world_reuse_fraction"] == 0.5, r
    assert r["commands_rerun"] >= 1 and 0.0 <= r["same_state_disagreement"] <= 1.0
    assert "replay 1/2 of openai_agent.py" in out.stderr  # progress as it goes


@pytest.mark.parametrize("argv, message", [
    (["--examples", "nope.py"], "no example program 'nope.py'"),
    (["--tasks", ","], "--tasks names nothing"),
    (["--tasks", "no-such-task"], "no-such-task"),
])
def test_bench_fidelity_refuses_bad_input_before_any_work(argv, message, capsys):
    assert main(["bench", "fidelity", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
