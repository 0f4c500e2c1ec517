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


# ---------------------------------------------------------------------------- a user's own tasks (issue 30)

def _task(root: Path, name: str, check: str = '[ "$(cat out.txt)" = hi ]\n', **files: str) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "instruction.md").write_text("Write hi into out.txt.\n")
    if check is not None:
        (d / "check.sh").write_text(check)
    for rel, text in files.items():
        p = d / rel.replace("__", "/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return d


def test_a_task_folder_needs_an_instruction_and_a_check(tmp_path):
    from tttr.recorders.tasks import load_task_dir, tasks_in

    d = _task(tmp_path, "no-check", check=None)
    with pytest.raises(TaskError, match="has no check.sh") as info:
        load_task_dir(d)
    assert info.value.exit_code == 2
    (d / "check.sh").write_text("true\n")
    (d / "instruction.md").write_text("  \n")
    with pytest.raises(TaskError, match="instruction.md is empty"):
        load_task_dir(d)
    e = _task(tmp_path, "bad-json", **{"task.json": "[1]"})
    with pytest.raises(TaskError, match="JSON object"):
        load_task_dir(e)
    with pytest.raises(TaskError, match="not a folder"):
        tasks_in(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TaskError, match="holds no task folder"):
        tasks_in(empty)
    t = load_task_dir(_task(tmp_path, "fine"))
    assert (t.name, t.difficulty, t.clock) == ("fine", "medium", datetime(2026, 3, 2, 10))


def test_a_check_bash_cannot_run_and_odd_start_trees_are_refused(tmp_path):
    import os

    from tttr.recorders.tasks import check_task_files, load_task_dir

    t = load_task_dir(_task(tmp_path, "syntax", check="if then fi\n"))
    with pytest.raises(TaskError, match="bash cannot run it"):
        check_task_files(t)
    t = load_task_dir(_task(tmp_path, "fifo", **{"tree__a.txt": "x"}))
    os.mkfifo(t.path / "tree" / "pipe")
    with pytest.raises(TaskError, match="files, folders and links only"):
        check_task_files(t)


def test_tasks_dir_names_must_be_unique_and_go_on_the_search_path(tmp_path, monkeypatch):
    from tttr.recorders.tasks import TASKS_PATH_ENV, use_task_dirs

    monkeypatch.delenv(TASKS_PATH_ENV, raising=False)
    a, b = tmp_path / "a", tmp_path / "b"
    _task(a, "one")
    _task(a, "two")
    _task(b, "one")
    with pytest.raises(TaskError, match="two task folders are named 'one'"):
        use_task_dirs([str(a), str(b)])
    _task(tmp_path / "c", "make-dir")
    with pytest.raises(TaskError, match="built-in task"):
        use_task_dirs([str(tmp_path / "c")])
    with pytest.raises(TaskError, match="unknown task 'two'"):
        load_task("two")
    assert [t.name for t in use_task_dirs([str(a)])] == ["one", "two"]
    assert load_task("two").path == a / "two"  # a replay finds it again by name
    assert [t.name for t in use_task_dirs([str(b / "one")])] == ["one"]  # one task folder itself


@needs_sandbox
def test_a_user_task_with_a_start_tree_checks_in_the_sandbox(tmp_path):
    d = _task(tmp_path, "greet", check="grep -qx done notes/todo.txt\n",
              **{"tree__notes__todo.txt": "buy milk\n", "solution.sh": "echo done >> notes/todo.txt\n",
                 "setup.sh": "echo extra > notes/extra.txt\n"})
    (d / "tree" / "link").symlink_to("/etc/passwd")  # copied as a link, never followed
    out = subprocess.run([sys.executable, "-m", "tttr.app", "task", "check", str(d)], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0 and "1/1 tasks ok" in out.stdout, out.stdout + out.stderr
    from tttr.recorders.tasks import load_task_dir

    task = load_task_dir(d)
    tree = tmp_path / "t"
    tree.mkdir()
    with Executor(tree) as ex:
        task.setup(tree, ex)
    assert (tree / "notes" / "todo.txt").read_text() == "buy milk\n" and (tree / "notes" / "extra.txt").exists()
    assert (tree / "link").is_symlink()
    d2 = _task(tmp_path, "no-solution")
    out = subprocess.run([sys.executable, "-m", "tttr.app", "task", "check", str(d2)], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0 and "solution absent" in out.stdout, out.stdout + out.stderr
    (d2 / "check.sh").write_text("true\n")  # a check that passes with nothing done
    out = subprocess.run([sys.executable, "-m", "tttr.app", "task", "check", str(d2)], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 1 and "nothing PASSES" in out.stdout
    (d2 / "check.sh").unlink()
    out = subprocess.run([sys.executable, "-m", "tttr.app", "task", "check", str(d2)], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "has no check.sh" in out.stderr
