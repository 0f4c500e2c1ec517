"""Two runs side by side: what the compare screen draws, built from `engine.diff.diff_runs`.

Plain data (no textual): `build_comparison` runs in a worker thread with its own store
connection (reporting its progress, and stopping when asked), and returns rows the
side-by-side widget only has to paint. The two messages of a row are read when the row is
shown (`Comparison.read_message`), not all up front.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from tttr.app.runview import RunView, is_blob, value_problem
from tttr.engine.replay.diff import ScanCancelled, align, scan_runs
from tttr.sessions.vocabulary import SETUP_STEP, site_order, site_parts


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One side of a compare row: an agent step (its action and the tool's result), or
    the setup (step -1: `action` is its clock, `output` its tree)."""

    step: int
    action: str
    exit_code: int | None = None
    output: str = ""  # first line of the command's output
    problem: str | None = None  # why the action's value is unreadable
    tool_problem: str | None = None  # why the tool result's value is unreadable
    command: bool = True  # the action is a shell command (a program's message, tool call or clock read is not)


@dataclass(frozen=True, slots=True)
class CompareRow:
    a: StepInfo | None
    b: StepInfo | None
    same: bool
    fork: bool = False  # the row holding the fork site
    first_divergence: bool = False  # the row of the earliest divergence, any layer


@dataclass(slots=True)
class Comparison:
    run_a: int
    run_b: int
    rows: list[CompareRow] = field(default_factory=list)
    divergences: dict[str, Any] = field(default_factory=dict)  # layer -> engine.diff.Divergence
    differing_sites: dict[str, int] = field(default_factory=dict)  # layer -> how many of its sites differ
    fork_site: str | None = None
    mutation: Any = None
    outcome_a: Any = None
    outcome_b: Any = None
    note: str | None = None  # why no divergence is named: the engine's diff refused the runs
    # (run, step) -> that step's message as its tokens, or None; read on demand, kept once read
    read_message: Callable[[int, int], tuple[str, ...] | None] | None = None
    _messages: dict[tuple[int, int], tuple[str, ...] | None] = field(default_factory=dict)

    def message(self, run_id: int, step: int) -> tuple[str, ...] | None:
        """Step `step`'s message in run `run_id` as its recorded tokens (read once)."""
        key = (run_id, step)
        if key not in self._messages:
            self._messages[key] = self.read_message(run_id, step) if self.read_message else None
        return self._messages[key]

    def token_texts(self, at: str) -> tuple[str | None, str | None]:
        """The recorded text of the token at site `at` (`2:token:5`) in each run, None where
        it has none."""
        parts = site_parts(at)
        if parts is None or parts[2] is None or parts[0] < 0:
            return None, None
        step, _, pos = parts
        messages = (self.message(self.run_a, step) or (), self.message(self.run_b, step) or ())
        return tuple(m[pos] if pos < len(m) else None for m in messages)  # type: ignore[return-value]

    def message_diff(self, row: CompareRow) -> MessageDiff | None:
        """The two messages of an aligned row, token by token; None for the setup's row or
        when neither run has a message there."""
        a = self.message(self.run_a, row.a.step) if row.a is not None and row.a.step >= 0 else None
        b = self.message(self.run_b, row.b.step) if row.b is not None and row.b.step >= 0 else None
        if a is None and b is None:
            return None
        return message_diff(a or (), b or ())

    @property
    def first(self):
        """The earliest divergence over all layers, in the order the agent loop consumes
        values; for a fork, the first one after the edited site (that one differs by
        construction). None when the runs agree."""
        ranked = sorted(
            (d for d in self.divergences.values() if d.site != self.fork_site),
            key=lambda d: site_order(d.site),
        )
        return ranked[0] if ranked else None

    @property
    def at_fork(self):
        """The divergence at the fork site itself, when it is the only one the engine
        names for its layer (a fork whose later values all agree)."""
        return next((d for d in self.divergences.values() if d.site == self.fork_site), None)


@dataclass(frozen=True, slots=True)
class MessageDiff:
    """Two messages as their tokens, each marked True where it is not in the other (by a
    longest-matching-blocks alignment, as `difflib` aligns lines)."""

    a: tuple[str, ...]
    b: tuple[str, ...]
    a_marks: tuple[bool, ...]
    b_marks: tuple[bool, ...]

    @property
    def differing(self) -> tuple[int, int]:
        return sum(self.a_marks), sum(self.b_marks)


def message_diff(a: tuple[str, ...], b: tuple[str, ...]) -> MessageDiff:
    a_marks, b_marks = [True] * len(a), [True] * len(b)
    for block in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        a_marks[block.a:block.a + block.size] = [False] * block.size
        b_marks[block.b:block.b + block.size] = [False] * block.size
    return MessageDiff(tuple(a), tuple(b), tuple(a_marks), tuple(b_marks))


_WORDS = re.compile(r"\s+|\w+|[^\w\s]")


def read_message(store, run_id: int, step: int) -> tuple[str, ...] | None:
    """Step `step`'s message as the tokens the model wrote (their recorded texts); a message
    recorded without tokens (an API call's) as its words; None when the step has neither,
    or its events cannot be read."""
    try:
        tokens = [str(e.value.get("text", "")) for e in store.events(run_id, step=step, kind="token")
                  if value_problem(e) is None and isinstance(e.value, dict)]
        if tokens:
            return tuple(tokens)
        for e in store.events(run_id, step=step, kind="message"):
            if value_problem(e) is None and isinstance(e.value, dict):
                return tuple(_WORDS.findall(str(e.value.get("text", ""))))
    except Exception:  # noqa: BLE001 - a step that cannot be read has no message to show
        return None
    return None


def _events(store, run_id: int, kind: str) -> list:
    """The run's events of `kind`; when the store refuses the indexed read (an event it
    cannot decode), read window by window with stand-ins for the unreadable ones."""
    try:
        return store.events(run_id, kind=kind)
    except Exception:  # noqa: BLE001 - the slow path finds the unreadable one
        view = RunView(store, run_id)
        return [e for e in (view.event(i) for i in range(view.count)) if e is not None and e.kind in (kind, "?")]


def _action_text(value: dict) -> str:
    if value.get("done"):
        return "done"
    cmd = value.get("cmd", "")
    return f"‹blob {cmd.get('size', '?')} bytes›" if is_blob(cmd) else str(cmd)


def _steps(store, run_id: int) -> list[StepInfo]:
    """One StepInfo per step of the run, as its kind describes its steps (`RunKind.steps`, the
    list `tttr diff`'s rows index): the agent's actions with their tools' results, or a run of
    model calls' messages, SDK tools, clock reads and end. An unreadable step keeps its row, in
    its place, and says why."""
    from tttr.engine.kinds import kind_of
    from tttr.engine.replay.steps import Step

    kind = kind_of(store.run(run_id))
    events = {e.seq: e for k in kind.step_kinds for e in _events(store, run_id, k) if e.kind in (k, "?")}
    unreadable = [Step(e.step, "?", "", e) for e in events.values() if e.kind == "?"]
    steps = sorted(kind.steps([e for e in events.values() if e.kind != "?"]) + unreadable, key=lambda s: s.event.seq)
    tools = {e.step: e for e in _events(store, run_id, "tool") if e.kind == "tool"} \
        if any(s.kind == "action" for s in steps) else {}
    return [_step_info(s.event, tools) for s in steps]


def _step_info(e, tools: dict) -> StepInfo:
    """One compare side: an agent's action (or an event that could not be read) with its tool's
    result; a call's message, an SDK tool's call and result, a clock read, the program's end."""
    from tttr.app.describe import is_program_end, program_line, sdk_call_line

    problem = value_problem(e)
    if e.kind in ("action", "?"):
        tool = tools.get(e.step)
        tool_problem = value_problem(tool) if tool is not None else None
        code, first_line = _result(tool.value) if tool is not None and tool_problem is None else (None, "")
        action = "" if problem is not None or e.kind != "action" else _action_text(e.value)
        return StepInfo(e.step, action, code, first_line, problem, tool_problem)
    v = e.value if problem is None and isinstance(e.value, dict) else {}
    code, first_line, command = None, "", False
    if e.kind == "message":
        action = str(v.get("text", ""))
    elif e.kind == "clock":
        action = f"clock {v.get('t', '')}"
    elif "function" in v:
        action = sdk_call_line(v, 80).plain
    else:  # sdk.shell's command, or the program itself
        action = program_line(v) if is_program_end(e) else str(v.get("cmd", ""))
        code, first_line = _result(v)
        command = True
    return StepInfo(e.step, action, code, first_line, problem, command=command)


def _result(value: dict) -> tuple[int | None, str]:
    """A command's exit code and the first line of its output."""
    stdout = value.get("stdout")
    if is_blob(stdout):  # not worth reading for one line
        stdout = f"‹{stdout.get('size', '?')} bytes›"
    text = str(stdout or value.get("stderr", "") or "")[:4096]
    return value.get("exit_code"), next((ln for ln in text.splitlines() if ln.strip()), "")


def _setup(store, run_id: int) -> StepInfo | None:
    """The run's setup as a compare side: its clock and its tree; None without setup events."""
    events = [e for kind in ("clock", "setup") for e in _events(store, run_id, kind)
              if e.step == SETUP_STEP and e.kind in ("clock", "setup")]
    if not events:
        return None
    problems = [f"{e.site}: {value_problem(e)}" for e in events if value_problem(e) is not None]
    values = {e.kind: e.value for e in events if value_problem(e) is None and isinstance(e.value, dict)}
    clock = values.get("clock", {}).get("t") or values.get("setup", {}).get("clock")
    tree = values.get("setup", {}).get("tree")
    return StepInfo(SETUP_STEP, "" if clock is None else str(clock), None,
                    "" if tree is None else f"tree {str(tree)[:16]}", problems[0] if problems else None)


def build_comparison(store, run_a: int, run_b: int, *, progress=None, cancelled=None) -> Comparison:
    """Rows of the two runs side by side, aligned as `tttr diff` aligns them: by edit
    distance over the actions (`engine.replay.diff.align`), for a fork and its parent as
    for any two runs — a fork's shared prefix has equal actions, so it pairs one to one.
    When the engine refuses to diff the runs (an unreadable value), the steps are aligned
    the same way here, an unreadable action matching nothing, no divergence is named, and
    `note` says why. The divergences come from the engine's quick scan (`scan_runs`, the
    same result as `diff_runs`); `progress(done, total)` follows it, and `cancelled()`
    returning True stops it (ScanCancelled). Messages are read from `store` when asked for:
    a caller that closes `store` sets `read_message` to read from another."""
    a_steps, b_steps = _steps(store, run_a), _steps(store, run_b)
    note = None
    try:
        diff = scan_runs(store, run_a, run_b, progress=progress, cancelled=cancelled)
        divergences, differing = dict(diff.first_divergence), dict(diff.differing_sites)
        rows = diff.rows  # each run's steps as its kind describes them, as `_steps` lists them
    except ScanCancelled:
        raise
    except Exception as exc:  # noqa: BLE001 - the rows still show, with the unreadable ones marked
        divergences, differing = {}, {}
        note = f"{type(exc).__name__}: {exc}" if getattr(exc, "exit_code", None) is None else str(exc)
        rows = align([s.action if s.problem is None else f"\0unreadable a{i}" for i, s in enumerate(a_steps)],
                     [s.action if s.problem is None else f"\0unreadable b{i}" for i, s in enumerate(b_steps)])
    run_b_meta = store.run(run_b)
    child = run_b_meta.parent == run_a
    fork_site = run_b_meta.fork_site if child and isinstance(run_b_meta.fork_site, str) else None
    comparison = Comparison(
        run_a, run_b, divergences=divergences, differing_sites=differing, fork_site=fork_site,
        mutation=run_b_meta.mutation if fork_site else None,
        outcome_a=store.run(run_a).outcome, outcome_b=run_b_meta.outcome, note=note,
        read_message=lambda run_id, step: read_message(store, run_id, step),
    )
    fork_step = site_order(fork_site)[0] if fork_site else None
    first = comparison.first
    first_step = site_order(first.site)[0] if first is not None else None
    if first is None and comparison.at_fork is not None:
        first_step = site_order(comparison.at_fork.site)[0]  # the fork is the only difference: mark it
    pairs = [(a_steps[row.a_step] if row.a_step is not None and row.a_step < len(a_steps) else None,
              b_steps[row.b_step] if row.b_step is not None and row.b_step < len(b_steps) else None,
              row.same) for row in rows]
    setup_a, setup_b = _setup(store, run_a), _setup(store, run_b)
    if setup_a is not None or setup_b is not None:
        same_setup = (setup_a is not None and setup_b is not None
                      and (setup_a.action, setup_a.output) == (setup_b.action, setup_b.output))
        pairs.insert(0, (setup_a, setup_b, same_setup))
    marked_fork = marked_first = False
    for a, b, row_same in pairs:
        steps = {s.step for s in (a, b) if s is not None}
        is_fork = not marked_fork and fork_step is not None and fork_step in steps
        is_first = not marked_first and first_step is not None and (
            first_step in steps or min(steps, default=first_step) > first_step
        )
        marked_fork |= is_fork
        marked_first |= is_first
        same = row_same and not any(s is not None and (s.problem or s.tool_problem) for s in (a, b))
        comparison.rows.append(CompareRow(a, b, same, is_fork, is_first))
    return comparison

