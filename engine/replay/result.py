"""What a replay or fork reports: its result, its refusal, and the one note about kernels
that a comparison of logits needs. Shared by the shell agent's runs (`runs.py`) and the
recorded API calls' (`calls.py`)."""

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
    run_id: int | None
    status: str
    outcome: Outcome | None  # given as an Outcome or its fields (a dict), kept as an Outcome
    actions: list[str]
    identical: bool | None = None
    divergence: Divergence | None = None
    same_outcome: bool | None = None  # the end state (passed, final tree) equals the recording's
    parent: int | None = None
    logits_computed: int = 0
    commands_run: int = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.outcome is not None:
            self.outcome = Outcome.of(self.outcome)

    @property
    def passed(self) -> bool | None:
        return None if self.outcome is None else self.outcome.passed

    def to_json(self) -> dict:
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
            **self.extra,
        }


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
