"""The task suite: every task's solution passes and doing nothing fails, in the sandbox."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from tttr.recorders.errors import TaskError
from tttr.recorders.sandbox import Executor
from tttr.recorders.tasks import list_tasks, load_task, self_check
from tests.sandbox_helpers import needs_sandbox

ROOT = Path(__file__).resolve().parent.parent
TASKS = list_tasks()


def test_suite_shape():
    assert len(TASKS) >= 10
    tags = [set(t.tags) for t in TASKS]
    assert sum("date" in t for t in tags) >= 3
    assert any("pid" in t for t in tags)
    assert any("listing" in t for t in tags)
    assert any("random" in t for t in tags)
    assert sum(t.difficulty == "easy" for t in TASKS) >= 3
    for t in TASKS:
        assert t.instruction and t.clock.year >= 2020


def test_unknown_task_is_a_user_error():
    with pytest.raises(TaskError) as info:
        load_task("no-such-task")
    assert info.value.exit_code == 2 and "make-dir" in str(info.value)
    with pytest.raises(TaskError):
        load_task("../tasks")


@needs_sandbox
@pytest.mark.parametrize("name", [t.name for t in TASKS])
def test_solution_passes_and_nothing_fails(name):
    r = self_check(load_task(name), seed=3)
    assert r.ok, r.detail


@needs_sandbox
def test_date_tasks_follow_the_virtual_clock(tmp_path):
    task = load_task("today-report")
    for clock in (datetime(2027, 1, 15, 9), datetime(2030, 6, 1, 12)):
        r = self_check(task, clock=clock)
        assert r.ok, r.detail
    tree = tmp_path / "t"
    tree.mkdir()
    with Executor(tree) as ex:
        task.setup(tree, ex, datetime(2027, 1, 15, 9))
        assert (tree / "reports" / "2027-01-14.txt").exists()
        task.solve(tree, ex, datetime(2027, 1, 15, 9))
        assert task.check(tree, ex, datetime(2027, 1, 15, 9))[0]
        assert not task.check(tree, ex, datetime(2027, 1, 16, 9))[0]  # a day later it is stale


@needs_sandbox
def test_random_name_depends_on_the_seed_only(tmp_path):
    task = load_task("random-name")
    names = []
    for i, seed in enumerate((1, 1, 2)):
        tree = tmp_path / f"t{i}"
        tree.mkdir()
        with Executor(tree, seed=seed) as ex:
            task.setup(tree, ex)
        names.append([p.name for p in (tree / "incoming").iterdir()])
    assert names[0] == names[1] != names[2]


@needs_sandbox
def test_cli_tasks_and_task_check():
    out = subprocess.run([sys.executable, "-m", "tttr.app", "tasks"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and "rotate-logs" in out.stdout
    out = subprocess.run([sys.executable, "-m", "tttr.app", "task", "check", "make-dir"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1/1 tasks ok" in out.stdout
    out = subprocess.run([sys.executable, "-m", "tttr.app", "task", "check"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and "--all" in out.stderr
