"""The numbers of a variance decomposition: pass rates with a Wilson interval, action
agreement between runs, and how much of the disagreement each pinned layer removes.

Pure arithmetic on named values, so each piece is tested on hand-built inputs; reading runs
from a store and recording them is `suite.py`'s business.

- **State-modifying action**: a tool call whose sandbox tree after the command differs from
  the tree before it (`tree_after != tree_before`: a file created, deleted, renamed, written
  or re-moded). Reads (`ls`, `cat`), `cd` and `export`, and failed commands that changed no
  file do not count. An action is its command text, whitespace-trimmed.
- **Agreement** of a set of runs: the fraction of run pairs (within one task and condition)
  whose sequences of state-modifying actions are equal — the seed study's metric.
- **Decomposition**: disagreement = 1 - agreement. The free condition's disagreement is
  today's run-to-run variance; pinning a layer removes `free - condition` of it; what remains
  with every layer pinned is the residual, which must be zero (the replay would otherwise
  not be a controlled experiment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Iterable, Sequence

# The suite's conditions, in the order they are shown: which of the layers each one pins.
# The tensor layer is pinned in all four by the invariant kernels (a position's logits do not
# depend on the batch it lands in), so the conditions vary the token and trace layers.
CONDITIONS = ("free", "token-pinned", "trace-pinned", "pinned")
PINNED_LAYER = {"token-pinned": "token", "trace-pinned": "trace"}


@dataclass(frozen=True, slots=True)
class Interval:
    low: float
    high: float


def wilson(successes: int, n: int, z: float = 1.959964) -> Interval | None:
    """The Wilson score interval for a binomial proportion (95% by default); None for n = 0."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"wilson: need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At the edges the interval reaches 0 or 1 exactly (rounding would leave 0.9999999999999999).
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(low, high)


def state_actions(tool_values: Iterable[dict]) -> tuple[str, ...]:
    """The commands, in order, of the tool calls that changed the sandbox's tree."""
    out = []
    for v in tool_values:
        if not isinstance(v, dict):
            continue
        before, after = v.get("tree_before"), v.get("tree_after")
        if before is not None and after is not None and before != after:
            out.append(str(v.get("cmd", "")).strip())
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Agreement:
    pairs: int
    agreeing: int

    @property
    def fraction(self) -> float | None:
        return self.agreeing / self.pairs if self.pairs else None

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(self.pairs + other.pairs, self.agreeing + other.agreeing)


def agreement(sequences: Sequence[tuple]) -> Agreement:
    """How many of the run pairs have equal action sequences."""
    pairs = list(combinations(sequences, 2))
    return Agreement(len(pairs), sum(a == b for a, b in pairs))


@dataclass(frozen=True, slots=True)
class Outcomes:
    """One condition's runs of one task (or pooled over tasks): pass counts and agreement
    (on state-modifying actions; and, for a program's runs, on its model calls' answers and
    on the checked outcome)."""

    runs: int
    passed: int
    agreement: Agreement
    calls: Agreement = Agreement(0, 0)
    verdicts: Agreement = Agreement(0, 0)

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.runs if self.runs else None

    @property
    def interval(self) -> Interval | None:
        return wilson(self.passed, self.runs)

    def __add__(self, other: Outcomes) -> Outcomes:
        return Outcomes(self.runs + other.runs, self.passed + other.passed, self.agreement + other.agreement,
                        self.calls + other.calls, self.verdicts + other.verdicts)


def outcomes(runs: Sequence[tuple[bool, tuple]], calls: Sequence[tuple] | None = None) -> Outcomes:
    """From (passed, state-modifying actions) per run, and (a program's) model calls per run."""
    return Outcomes(len(runs), sum(bool(p) for p, _ in runs), agreement([a for _, a in runs]),
                    agreement(list(calls)) if calls is not None else Agreement(0, 0),
                    agreement([(p is True,) for p, _ in runs]))


@dataclass(frozen=True, slots=True)
class Decomposition:
    """Disagreement (1 - agreement) per condition, and what pinning each layer removes from
    the free condition's. A value is None where its condition has no run pair."""

    disagreement: dict[str, float | None]

    def removed_by(self, layer: str) -> float | None:
        """How much of the free condition's disagreement disappears with `layer` pinned."""
        cond = next(c for c, lay in PINNED_LAYER.items() if lay == layer)
        free, pinned = self.disagreement.get("free"), self.disagreement.get(cond)
        return None if free is None or pinned is None else free - pinned

    def share_removed_by(self, layer: str) -> float | None:
        """The same, as a share of the free condition's disagreement (None when it has none)."""
        removed, free = self.removed_by(layer), self.disagreement.get("free")
        return None if removed is None or not free else removed / free

    @property
    def residual(self) -> float | None:
        """Disagreement with every layer pinned: must be 0."""
        return self.disagreement.get("pinned")

    @property
    def residual_ok(self) -> bool:
        return self.residual in (None, 0.0)

    def to_json(self) -> dict:
        return {
            "disagreement": self.disagreement,
            "removed_by_token": self.removed_by("token"),
            "removed_by_trace": self.removed_by("trace"),
            "share_removed_by_token": self.share_removed_by("token"),
            "share_removed_by_trace": self.share_removed_by("trace"),
            "residual": self.residual,
            "residual_ok": self.residual_ok,
        }


def decompose(by_condition: dict[str, Outcomes]) -> Decomposition:
    dis = {}
    for cond in CONDITIONS:
        o = by_condition.get(cond)
        frac = o.agreement.fraction if o is not None else None
        dis[cond] = None if frac is None else 1.0 - frac
    return Decomposition(dis)
