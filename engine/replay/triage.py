"""Locate the layer: replay BAD once per layer with that layer's values taken from GOOD
(its deltas against BAD applied, the other layers left at BAD's), and see per layer whether
the failure disappears.

- tensor: GOOD's kernel mode (the logits computed live in it);
- token: GOOD's seed, and GOOD's token where a step's context is the same;
- trace: GOOD's clock readings, and its tool results where the request matches.

A layer with no delta is not replayed (it cannot be the cause on its own). The verdict
names the layer(s) whose values alone fix BAD, or says the difference needs more than one.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from tttr.engine.replay.deltas import Delta, Pair, by_layer, differing
from tttr.engine.replay.trial import Judge, Trial, apply, check_ends, recorded_actions
from tttr.sessions.vocabulary import RECORDED_LAYERS


@dataclass(slots=True)
class LayerResult:
    layer: str
    deltas: list[Delta]
    trial: Trial | None  # None: no delta in this layer, not replayed

    @property
    def fixed(self) -> bool | None:
        return None if self.trial is None else not self.trial.failed

    def to_json(self) -> dict:
        return {"layer": self.layer, "deltas": [d.to_json() for d in self.deltas], "fixed": self.fixed,
                "replay": None if self.trial is None else self.trial.to_json()}


@dataclass(slots=True)
class Triage:
    good: int
    bad: int
    judge: str
    layers: list[LayerResult] = field(default_factory=list)

    @property
    def culprits(self) -> list[str]:
        return [r.layer for r in self.layers if r.fixed]

    def verdict(self) -> str:
        c = self.culprits
        if len(c) == 1:
            return f"the {c[0]} layer: BAD with GOOD's {c[0]} values no longer fails"
        if c:
            return f"each of the {' and '.join(c)} layers alone fixes BAD"
        return "needs more than one layer: no single layer's values from GOOD fix BAD (tttr bisect finds the deltas)"

    def to_json(self) -> dict:
        return {"good": self.good, "bad": self.bad, "judge": self.judge, "culprits": self.culprits,
                "verdict": self.verdict(), "layers": [r.to_json() for r in self.layers]}


def prepare(store, good: int, bad: int, judge: str, *, runtime, unsafe_no_sandbox: bool = False
            ) -> tuple[Pair, Judge, list[Delta]]:
    """Everything checked before anything is written (a read-only store will do): the pair,
    its deltas (GOOD's values against BAD), GOOD's faithful replay and BAD's failure."""
    pair = Pair.load(store, bad, good)
    found = differing(pair)
    the_judge = Judge(judge, tuple(recorded_actions(pair.other)))
    check_ends(store, Pair(pair.other, pair.base), the_judge, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox)
    return pair, the_judge, found


def triage(store, good: int, bad: int, *, judge: str = "outcome", runtime, unsafe_no_sandbox: bool = False,
           on_layer: Callable[[LayerResult], None] | None = None,
           cancel: threading.Event | None = None) -> Triage:
    pair, the_judge, found = prepare(store, good, bad, judge, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox)
    out = Triage(good, bad, judge)
    layers = by_layer(found)
    with runtime.reusing_prefixes():  # the replays of BAD share their live steps' prefixes
        for layer in RECORDED_LAYERS:
            subset = layers[layer]
            trial = apply(store, pair, subset, the_judge, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox,
                          cancel=cancel) if subset else None
            result = LayerResult(layer, subset, trial)
            out.layers.append(result)
            if on_layer is not None:
                on_layer(result)
    return out
