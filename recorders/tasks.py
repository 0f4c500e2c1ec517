"""The task suite: small system-administration tasks in assets/tasks/<name>/.

Each task folder holds:
  instruction.md   what the agent is asked to do
  task.json        {"clock": ISO default start clock, "difficulty": "easy"|"medium", "tags": [...]}
  setup.sh         builds the starting tree (runs in the sandbox at /work, sees the clock)
  check.sh         judges the end state: exit 0 = pass (runs in the sandbox, sees the clock)
  solution.sh      a reference solution that passes
Scripts run through the same executor as the agent's commands, so the clock, PIDs and
randomness they see are the trace layer's, and a date-dependent task is judged against
the virtual clock.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from tttr.recorders.clock import iso, normalize_clock, parse_clock
from tttr.recorders.errors import TaskError
from tttr.recorders.limits import Limits
from tttr.recorders.sandbox import CommandResult, Executor, ShellState
from tttr.sessions.vocabulary import SETUP_STEP

TASKS_DIR = Path(__file__).resolve().parent.parent / "assets" / "tasks"
CHECK_STEP = 1_000_000   # the checker's randomness never collides with an agent step's
REQUIRED = ("instruction.md", "task.json", "setup.sh", "check.sh", "solution.sh")


@dataclass(frozen=True, slots=True)
class Task:
    name: str
    instruction: str
    clock: datetime                 # default start clock of a run
    difficulty: str
    tags: tuple[str, ...]
    path: Path

    def script(self, name: str) -> str:
        return (self.path / f"{name}.sh").read_text()

    def setup(self, tree: Path, executor: Executor, clock: datetime | None = None) -> CommandResult:
        """Build the starting tree; a failing setup is a broken task, not a failed run."""
        res = executor.run(self.script("setup"), self._clock(clock), step=SETUP_STEP, state=ShellState())
        if res.exit_code != 0:
            raise TaskError(f"setup of task {self.name!r} failed (exit {res.exit_code}): "
                            f"{(res.stderr or res.stdout).strip()[-300:]}")
        return res

    def check(self, tree: Path, executor: Executor, clock: datetime | None = None) -> tuple[bool, int, str]:
        """(passed, checker exit code, checker output) for the tree's end state."""
        res = executor.run(self.script("check"), self._clock(clock), step=CHECK_STEP, state=ShellState())
        return res.exit_code == 0, res.exit_code, (res.stdout + res.stderr).strip()

    def solve(self, tree: Path, executor: Executor, clock: datetime | None = None) -> CommandResult:
        return executor.run(self.script("solution"), self._clock(clock), step=0, state=ShellState())

    def _clock(self, clock: datetime | None) -> datetime:
        return normalize_clock(clock) if clock is not None else self.clock

    def to_json(self) -> dict:
        return {"name": self.name, "instruction": self.instruction, "clock": iso(self.clock),
                "difficulty": self.difficulty, "tags": list(self.tags)}


@dataclass(frozen=True, slots=True)
class TaskCheck:
    name: str
    solution_passes: bool
    nothing_fails: bool
    detail: str

    @property
    def ok(self) -> bool:
        return self.solution_passes and self.nothing_fails


def _load(path: Path) -> Task:
    missing = [f for f in REQUIRED if not (path / f).is_file()]
    if missing:
        raise TaskError(f"task folder {str(path)!r} lacks {', '.join(missing)}")
    try:
        meta = json.loads((path / "task.json").read_text())
    except json.JSONDecodeError as exc:
        raise TaskError(f"{path / 'task.json'}: not JSON ({exc})") from None
    clock = parse_clock(meta.get("clock", "2026-03-02T10:00:00"))
    difficulty = meta.get("difficulty", "medium")
    if difficulty not in ("easy", "medium", "hard"):
        raise TaskError(f"{path / 'task.json'}: difficulty {difficulty!r} is not easy, medium or hard")
    return Task(
        name=path.name,
        instruction=(path / "instruction.md").read_text().strip(),
        clock=clock,
        difficulty=difficulty,
        tags=tuple(meta.get("tags", ())),
        path=path,
    )


def list_tasks(root: Path = TASKS_DIR) -> list[Task]:
    return [_load(p) for p in sorted(root.iterdir()) if p.is_dir() and (p / "task.json").exists()]


def load_task(name: str, root: Path = TASKS_DIR) -> Task:
    path = root / name
    if "/" in name or name.startswith(".") or not _is_task(path):
        known = ", ".join(t.name for t in list_tasks(root))
        raise TaskError(f"unknown task {name[:80]!r}{'…' if len(name) > 80 else ''}: choose one of {known} "
                        "(see `tttr tasks`)")
    return _load(path)


def _is_task(path: Path) -> bool:
    try:
        return (path / "task.json").is_file()
    except (OSError, ValueError):  # a name longer than a file name, or holding a NUL: no such task
        return False


def self_check(task: Task, seed: int = 0, unsafe_no_sandbox: bool = False,
               clock: datetime | None = None, limits: Limits = Limits()) -> TaskCheck:
    """Setup + reference solution + checker must pass; setup + nothing + checker must fail.
    Each in a fresh tree."""
    verdicts = []
    notes = []
    for solve in (True, False):
        tmp = Path(tempfile.mkdtemp(prefix=f"tttr-task-{task.name}-"))
        try:
            with Executor(tmp, seed=seed, unsafe_no_sandbox=unsafe_no_sandbox, limits=limits) as ex:
                task.setup(tmp, ex, clock)
                if solve:
                    res = task.solve(tmp, ex, clock)
                    if res.exit_code != 0:
                        notes.append(f"solution exit {res.exit_code}: {res.stderr.strip()[-200:]}")
                passed, code, out = task.check(tmp, ex, clock)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        verdicts.append(passed)
        if passed != solve:
            label = "with the solution" if solve else "with nothing done"
            notes.append(f"checker {'passed' if passed else 'failed'} {label} (exit {code}): {out[-200:]}")
    return TaskCheck(task.name, verdicts[0], not verdicts[1], "; ".join(notes))
