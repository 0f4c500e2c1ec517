"""Several mutations at once: the oracle's generalisation of a fork's one new value, used by
the experiments (triage, bisect) that apply a set of deltas between two recordings.

A set answers the oracle's one question — which new value, if any, replaces the `kind`
value of `step` — and keeps the difference between the two ways it is used:

- a fork (`strict`): its one mutation must apply where the user put it; a token mutation
  whose context is not the recording's is an error.
- an experiment (not strict): a mutation applies only where its site exists in the run as it
  now unfolds, "where the request matches": a tool mutation that names its request (`cmd`,
  `tree_before`) applies only when the agent runs that command on that tree, and a token
  mutation only where the step's context is the recording's. Others are skipped, and the
  set reports which sites it applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tttr.engine.replay.mutation import Mutation, MutationError

REQUEST_KEYS = ("cmd", "tree_before")  # in a tool mutation's value: a condition, not a replacement


@dataclass(frozen=True, slots=True)
class MutationSet:
    mutations: tuple[Mutation, ...]
    strict: bool = False
    applied: list[str] = field(default_factory=list, compare=False)  # sites, as the oracle applied them

    def __post_init__(self) -> None:
        seen: set[tuple[str, int]] = set()
        for m in self.mutations:
            key = (m.site.name, m.site.step)
            if key in seen:  # a step has one clock, one tool call, and one message forked at one position
                raise MutationError(f"two mutations of the {m.site.name} of step {m.site.step}: give one")
            seen.add(key)

    @classmethod
    def of(cls, mutation) -> "MutationSet":
        """A fork's one mutation (strict), a set as it is, or the empty set."""
        if isinstance(mutation, MutationSet):
            return mutation
        return cls((mutation,), strict=True) if mutation is not None else cls(())

    def __bool__(self) -> bool:
        return bool(self.mutations)

    def get(self, kind: str, step: int) -> Mutation | None:
        return next((m for m in self.mutations if m.at(kind, step)), None)

    def at(self, kind: str, step: int) -> bool:
        """Whether a mutation replaces the `kind` value of `step` (the API of one `Mutation`)."""
        return self.get(kind, step) is not None

    def tool(self, step: int, request: dict) -> Mutation | None:
        """The tool mutation of `step` if its request (when it names one) is `request`."""
        m = self.get("tool", step)
        if m is None or not isinstance(m.value, dict):
            return m
        if any(k in m.value and m.value[k] != request.get(k) for k in REQUEST_KEYS):
            return None
        return m

    def took(self, m: Mutation) -> None:
        self.applied.append(str(m.site))

    def to_json(self) -> list[dict]:
        return [m.to_json() for m in self.mutations]
