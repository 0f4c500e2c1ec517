"""What a run's verbs report: one result type, `RunResult`, that every kind's record, replay
and fork returns (engine/kinds.py), so a caller reads `run_id`, `parent`, `status`, `outcome` /
`passed`, `identical` and `divergence` the same way whatever the kind; each kind's own facts are
a subclass's fields: `CallsResult` (served API calls, `calls.py`), `ProgramResult` (a program
recorded, engine/program/record.py), `ReplayResult` (a program replayed or forked, also against
an imported trace: engine/program/replay.py). Here too: a replay's refusal and the one note
about kernels that a comparison of logits needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from tttr.engine.replay.divergence import Divergence
from tttr.kernels import REVISION
from tttr.sessions.errors import TTTRError
from tttr.sessions.records import Outcome


class ReplayError(TTTRError, ValueError):
    pass


@dataclass(slots=True)
class RunResult:
    """The new run (`run_id`; `parent`, the run replayed or forked, None for a recording;
    `status` "complete" or "incomplete"), how it ended (`outcome`, the stored one; `passed`, its
    checker's verdict) and, for a replay or fork, whether it did what the recording did
    (`identical`, the first `divergence`, `same_outcome`). `actions`: what the run did, one text
    per step (the agent's actions, the served calls' answers; a program's result lists none: its
    steps are its events)."""

    run_id: int | None
    status: str
    outcome: Outcome | None  # given as an Outcome or its fields (a dict), kept as an Outcome
    actions: list[str] = field(default_factory=list)
    identical: bool | None = None
    divergence: Divergence | None = None
    same_outcome: bool | None = None  # the end state (passed, final tree) equals the recording's
    parent: int | None = None
    logits_computed: int = 0
    commands_run: int = 0  # the agent's shell commands run live (a program's SDK tools: ReplayResult.tools_run)
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.outcome is not None:
            self.outcome = Outcome.of(self.outcome)

    @property
    def passed(self) -> bool | None:
        return None if self.outcome is None else self.outcome.passed

    def to_json(self) -> dict:
        return {**self._json(), **self.extra}

    def _json(self) -> dict:
        return {
            "run_id": self.run_id,
            "parent": self.parent,
            "status": self.status,
            "outcome": None if self.outcome is None else {
                k: self.outcome.get(k) for k in ("passed", "checker_exit", "checker_output", "reason") if k in self.outcome},
            "actions": self.actions,
            "steps": len(self.actions),
            "identical": self.identical,
            "same_outcome": self.same_outcome,
            "divergence": None if self.divergence is None else self.divergence.to_json(),
            "logits_computed": self.logits_computed,
            "commands_run": self.commands_run,
        }


@dataclass(slots=True)
class CallsResult(RunResult):
    """A replay or fork of API calls recorded by `tttr serve --db`: `actions` are the calls'
    answers, one per call (`calls`); no task outcome, no commands."""

    @property
    def calls(self) -> int:
        return len(self.actions)

    def to_json(self) -> dict:
        return {**self._json(), "calls": self.calls, **self.extra}


@dataclass(slots=True, kw_only=True)
class ProgramResult(RunResult):
    """`tttr record -- PROGRAM`: the recording (status "complete", no parent; `outcome` the stored
    one: exit code, calls, with --check the checker's verdict, `passed`) and what the program did:
    its exit code, its model calls (`calls`; `refused`: those answered with an error, unrecorded),
    its output and the limit it hit."""

    exit_code: int
    calls: int
    stdout: str
    stderr: str
    limit_hit: str | None = None
    refused: int = 0  # model calls answered with an error (a bad request): not in `calls`, the ones recorded

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "exit_code": self.exit_code, "calls": self.calls, "passed": self.passed,
                "limit_hit": self.limit_hit, "refused_calls": self.refused, "stdout": self.stdout,
                "stderr": self.stderr}


@dataclass(slots=True, kw_only=True)
class ReplayResult(RunResult):
    """A recorded program's replay or fork (engine/program/replay.py), also a program's run against
    an imported trace: the child run (status "incomplete" when an experiment cancelled it; `outcome`
    the stored one, with the recording's --check run again: `passed`), and what the program did
    beside the recording: exit codes, stdout, end tree (`same_tree` None: no recorded end tree),
    the steps answered from the recording and the SDK tools run live."""

    exit_code: int
    recorded_exit_code: int | None
    stdout: str
    same_stdout: bool
    same_tree: bool | None
    calls_answered: int
    tools_run: int = 0
    # Where the divergence is, for a machine (`--json`'s divergence: call, step, at, and field
    # {path, recorded, requested}): the call's index (or None), the step, the site (`1:prompt`,
    # `1:clock`, `2:tool`; None for a step of another kind), the field (`messages[1].content`,
    # `t`, `args`, `step`), and its recorded and requested values.
    detail: dict | None = None
    sealed: bool = False

    def to_json(self) -> dict:
        divergence = None
        if self.divergence is not None:
            d = self.detail or {}
            divergence = {**self.divergence.to_json(), "call": d.get("call"), "step": d.get("step"), "at": d.get("at"),
                          "field": {"path": d.get("field"), "recorded": d.get("recorded"),
                                    "requested": d.get("requested")} if d else None}
        return {"run_id": self.run_id, "parent": self.parent, "identical": self.identical, "sealed": self.sealed,
                "divergence": divergence,
                "exit_code": self.exit_code, "recorded_exit_code": self.recorded_exit_code,
                "same_stdout": self.same_stdout, "same_tree": self.same_tree, "calls_answered": self.calls_answered,
                "logits_computed": self.logits_computed, "tools_run": self.tools_run, "stdout": self.stdout,
                **self.extra}


def same_outcome(recorded: Outcome | None, live: Outcome | None) -> bool | None:
    """Whether two runs ended in the same state: the same verdict and the same final tree.
    Same decisions can end differently (a date task's files set up on another day)."""
    if recorded is None or live is None:
        return None
    return recorded.passed == live.passed and recorded.get("tree") == live.get("tree")


def kernels_note(recorded: dict) -> str | None:
    """One line when the recording's logits came from another revision of TTTR's kernels (or
    another digest): its tensor-layer values cannot match these bit for bit, whatever else
    holds. None when they are comparable."""
    from tttr.engine.inference.digest import LOGITS_DIGEST  # lazy: torch, which a faithful replay never loads

    theirs = recorded.get("kernels_revision")
    digest = recorded.get("logits_digest", "blake2b-128")
    if theirs == REVISION and digest == LOGITS_DIGEST:
        return None
    which = "an earlier revision" if theirs is None else f"revision {theirs}"
    return (f"note: the recording's logits come from TTTR kernels {which} ({digest} digests); this TTTR "
            f"computes revision {REVISION} ({LOGITS_DIGEST}): tensor-layer values differ by construction, "
            "so compare decisions, not logits digests")
