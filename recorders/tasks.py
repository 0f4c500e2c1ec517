"""Tasks: small system-administration tasks, each a folder.

The built-in suite lives in assets/tasks/<name>/; a user's own tasks are folders of the same
format anywhere (`tttr suite --tasks-dir DIR`, `tttr task check DIR`; docs/suites.md).
A task folder holds:
  instruction.md   what the agent is asked to do (required, not empty)
  check.sh         judges the end state: exit 0 = pass (required; runs in the sandbox at /work,
                   sees the clock, after the agent stops)
  tree/            the starting files, copied into /work (optional)
  setup.sh         builds or finishes the starting tree (optional; runs after tree/ is copied)
  task.json        {"clock": ISO default start clock, "difficulty": "easy"|"medium"|"hard",
                   "tags": [...]} (optional: the clock defaults to 2026-03-02T10:00:00)
  solution.sh      a reference solution that passes (optional; `tttr task check` runs it)
Scripts run through the same executor as the agent's commands, so the clock, PIDs and
randomness they see are the trace layer's, and a date-dependent task is judged against
the virtual clock.

Task names are folder names. A run stores its task's name; a replay finds the folder again in
the built-in suite, then in the folders of $TTTR_TASKS_PATH (colon-separated, like $PATH: each
a folder of task folders or one task folder), which `--tasks-dir` sets for the process.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
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
TASKS_PATH_ENV = "TTTR_TASKS_PATH"
CHECK_STEP = 1_000_000   # the checker's randomness never collides with an agent step's
DEFAULT_CLOCK = "2026-03-02T10:00:00"
REQUIRED = ("instruction.md", "check.sh")
START_TREE = "tree"
MAX_SCRIPT_BYTES = 1 << 20
NAME_MAX = 255


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

    def has(self, name: str) -> bool:
        return (self.path / f"{name}.sh").is_file()

    @property
    def start_tree(self) -> Path | None:
        tree = self.path / START_TREE
        return tree if tree.is_dir() and not tree.is_symlink() else None

    def setup(self, tree: Path, executor: Executor, clock: datetime | None = None) -> CommandResult | None:
        """Build the starting tree (tree/ copied, then setup.sh); a failing setup is a broken
        task, not a failed run."""
        if self.start_tree is not None:
            copy_start_tree(self.start_tree, tree)
        if not self.has("setup"):
            return None
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
    solution_passes: bool | None    # None: the task has no solution.sh
    nothing_fails: bool
    detail: str

    @property
    def ok(self) -> bool:
        return self.solution_passes is not False and self.nothing_fails


INSTRUCTION_FILE = "TTTR_TASK.md"          # a program agent's instruction, at the top of its tree
INSTRUCTION_ENV = "TTTR_TASK_INSTRUCTION"  # and in its environment


def task_env(env) -> dict[str, str]:
    """The task's environment a recorded program run names (its meta's `task_env`, written
    by a program suite, or None): only TTTR_TASK_* names with text values, as a replay hands
    them to the program again. A database may say anything: nothing else gets through."""
    if env is None:
        return {}
    return {k: v for k, v in env.items() if isinstance(k, str) and k.startswith("TTTR_TASK_") and k.isidentifier()
            and isinstance(v, str) and "\0" not in v}


def copy_start_tree(src: Path, dest: Path) -> None:
    """The task's tree/ into the run's fresh tree: files, folders and links (copied as links,
    never followed); anything else was refused when the task was checked."""
    shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)


def _text(path: Path, what: str) -> str:
    try:
        size = path.stat().st_size
        if size > MAX_SCRIPT_BYTES:
            raise TaskError(f"{path}: {what} is {size} bytes; keep it under {MAX_SCRIPT_BYTES}")
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TaskError(f"{path}: {what} is not UTF-8 text") from None
    except OSError as exc:
        raise TaskError(f"{path}: {what} cannot be read ({exc.strerror})") from None


def _load(path: Path) -> Task:
    if not path.is_dir():
        raise TaskError(f"task folder {str(path)!r} does not exist (a task is a folder: see docs/suites.md)")
    for f in REQUIRED:
        if not (path / f).is_file():
            what = ("the check (a bash script run in /work after the agent stops; exit 0 = pass)"
                    if f == "check.sh" else "the instruction the agent is given")
            raise TaskError(f"task folder {str(path)!r} has no {f}: add {what}")
    meta: dict = {}
    if (path / "task.json").is_file():
        try:
            meta = json.loads(_text(path / "task.json", "task.json"))
        except json.JSONDecodeError as exc:
            raise TaskError(f"{path / 'task.json'}: not JSON ({exc})") from None
        if not isinstance(meta, dict):
            raise TaskError(f"{path / 'task.json'}: give a JSON object ({{\"clock\": ..., \"difficulty\": ...}})")
    try:
        clock = parse_clock(str(meta.get("clock", DEFAULT_CLOCK)))
    except Exception as exc:  # noqa: BLE001 - the clock module says what is wrong
        raise TaskError(f"{path / 'task.json'}: {exc}") from None
    difficulty = meta.get("difficulty", "medium")
    if difficulty not in ("easy", "medium", "hard"):
        raise TaskError(f"{path / 'task.json'}: difficulty {difficulty!r} is not easy, medium or hard")
    tags = meta.get("tags", ())
    if not isinstance(tags, (list, tuple)) or not all(isinstance(t, str) for t in tags):
        raise TaskError(f"{path / 'task.json'}: tags must be a list of strings")
    instruction = _text(path / "instruction.md", "instruction.md").strip()
    if not instruction:
        raise TaskError(f"{path / 'instruction.md'} is empty: write what the agent is asked to do")
    return Task(name=path.name, instruction=instruction, clock=clock, difficulty=difficulty,
                tags=tuple(tags), path=path)


def load_task_dir(path: str | Path) -> Task:
    """One task folder of the user's, anywhere: TaskError in one line if it is not one."""
    path = Path(path).absolute()
    name = path.name
    if not name or name.startswith(".") or len(name.encode("utf-8", "surrogatepass")) > NAME_MAX:
        raise TaskError(f"{str(path)!r}: a task folder's name is the task's name; give a folder with a plain name")
    return _load(path)


def _is_task_folder(path: Path) -> bool:
    return any((path / f).exists() for f in (*REQUIRED, "task.json"))


def tasks_in(root: str | Path) -> list[Task]:
    """The tasks of a folder the user gives: the folder itself if it is one task folder, else
    each task folder in it. TaskError if there is none, or one is malformed."""
    root = Path(root).absolute()
    if not root.is_dir():
        raise TaskError(f"--tasks-dir {str(root)!r} is not a folder: give a task folder or a folder of them")
    if _is_task_folder(root):
        return [load_task_dir(root)]
    subs = [p for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith(".")]
    if not subs:
        raise TaskError(f"--tasks-dir {str(root)!r} holds no task folder (each needs instruction.md and check.sh; "
                        "see docs/suites.md)")
    return [load_task_dir(p) for p in subs]


def _search_path() -> list[str]:
    return [p for p in os.environ.get(TASKS_PATH_ENV, "").split(os.pathsep) if p]


def _user_task_path(name: str) -> Path | None:
    for root in _search_path():
        r = Path(root)
        try:
            if r.name == name and _is_task_folder(r):
                return r
            if (r / name).is_dir() and _is_task_folder(r / name):
                return r / name
        except (OSError, ValueError):
            continue
    return None


def use_task_dirs(dirs: list[str]) -> list[Task]:
    """Load every task of `dirs` (checked, see `check_task_files`), refuse a name that two
    folders or a built-in task share, and add the folders to this process's task search path
    (inherited by the processes it starts); the tasks, in order."""
    builtin = {t.name for t in list_tasks()}
    seen: dict[str, Path] = {}
    tasks = []
    for d in dirs:
        for t in tasks_in(d):
            if t.name in builtin:
                raise TaskError(f"task folder {str(t.path)!r} has the name of a built-in task ({t.name}): "
                                "rename the folder")
            if t.name in seen:
                raise TaskError(f"two task folders are named {t.name!r} ({seen[t.name]} and {t.path}): rename one")
            check_task_files(t)
            seen[t.name] = t.path
            tasks.append(t)
    roots = [str(Path(d).absolute()) for d in dirs]
    os.environ[TASKS_PATH_ENV] = os.pathsep.join(dict.fromkeys([*roots, *_search_path()]))
    return tasks


def check_task_files(task: Task) -> None:
    """What can be checked without running anything: each script parses as bash (`bash -n`),
    and tree/ holds only files, folders and links. TaskError naming the problem."""
    for name in ("check", "setup", "solution"):
        if not task.has(name):
            continue
        path = task.path / f"{name}.sh"
        text = _text(path, f"{name}.sh")
        res = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
        if res.returncode != 0:
            first = (res.stderr.strip().splitlines() or ["a syntax error"])[0]
            raise TaskError(f"{path}: bash cannot run it: {first.replace('bash: ', '')}")
    if (task.path / START_TREE).is_symlink():
        raise TaskError(f"{task.path / START_TREE}: the start tree is a link; make it a folder")
    tree = task.start_tree
    if tree is None:
        return
    for dirpath, dirnames, filenames in os.walk(tree):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            mode = os.lstat(p).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                raise TaskError(f"{p}: the start tree may hold files, folders and links only; remove it")


def list_tasks(root: Path = TASKS_DIR) -> list[Task]:
    return [_load(p) for p in sorted(root.iterdir()) if p.is_dir() and (p / "task.json").exists()]


def load_task(name: str, root: Path = TASKS_DIR) -> Task:
    """A task by name: in `root` (the built-in suite), then in $TTTR_TASKS_PATH's folders."""
    path = root / name
    if "/" in name or name.startswith(".") or not name:
        path = None
    elif not _is_task(path):
        path = _user_task_path(name) if root == TASKS_DIR else None
    if path is None:
        known = ", ".join(t.name for t in list_tasks(root))
        raise TaskError(f"unknown task {name[:80]!r}{'…' if len(name) > 80 else ''}: choose one of {known} "
                        f"(see `tttr tasks`), or for a task folder of your own put the folder holding it on "
                        f"${TASKS_PATH_ENV} (`tttr suite --tasks-dir` does so for its runs)")
    return _load(path)


def resolve_task(text: str) -> Task:
    """A task named on the command line: a folder (a path) or a built-in task's name."""
    if "/" in text or text in (".", "..") or Path(text).is_dir():
        return load_task_dir(text)
    return load_task(text)


def _is_task(path: Path) -> bool:
    try:
        return (path / "task.json").is_file()
    except (OSError, ValueError):  # a name longer than a file name, or holding a NUL: no such task
        return False


def self_check(task: Task, seed: int = 0, unsafe_no_sandbox: bool = False,
               clock: datetime | None = None, limits: Limits = Limits()) -> TaskCheck:
    """Setup + reference solution + checker must pass (when there is a solution.sh); setup +
    nothing + checker must fail. Each in a fresh tree."""
    check_task_files(task)
    verdicts: dict[bool, bool] = {}
    notes = []
    for solve in ((True, False) if task.has("solution") else (False,)):
        tmp = Path(tempfile.mkdtemp(prefix="tttr-task-"))
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
        verdicts[solve] = passed
        if passed != solve:
            label = "with the solution" if solve else "with nothing done"
            notes.append(f"checker {'passed' if passed else 'failed'} {label} (exit {code}): {out[-200:]}")
    if not task.has("solution"):
        notes.append("no solution.sh: only checked that doing nothing fails")
    return TaskCheck(task.name, verdicts.get(True), not verdicts[False], "; ".join(notes))
