"""Locate the layer: replay BAD once per layer with that layer's values taken from GOOD
(its deltas against BAD applied, the other layers left at BAD's), and see per layer whether
the failure disappears.

- tensor: GOOD's kernel mode (the logits computed live in it);
- token: GOOD's seed, and GOOD's token where a step's context is the same;
- trace: GOOD's clock readings, and its tool results where the request matches.

A layer with no delta is not replayed (it cannot be the cause on its own). The verdict
names the layer(s) whose values alone fix BAD, or says the difference needs more than one.

A replay of BAD that goes on past BAD's last command (on GOOD's path, say, once GOOD's token is
in) reaches steps BAD read no clock at; it reads GOOD's clock there (`unreached_clocks`), the
only recorded one, so that the world is in the state GOOD ran its commands in and answers them
as it did (engine/replay/world.py's `known_answer`) instead of at a made-up time no recording
asked about: a pipeline whose processes both write stderr, run live again, can interleave its
lines otherwise and send the run elsewhere.

The (up to three) replays are independent, so with `batch` they run side by side, each in a
thread and store connection of its own, their forward passes sharing the engine's batches
(bisect.py's `at_once`, as a bisect round's tests do). Sound only because the kernels are
batch-invariant (a replay gets the tokens and logits it gets alone): under `fast` kernels in
play they run one at a time. Either way the result lists the layers in RECORDED_LAYERS order.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Callable

from tttr.engine.replay.bisect import at_once, choose_batching, on_store
from tttr.engine.replay.deltas import Delta, Pair, by_layer, differing
from tttr.engine.replay.trial import Judge, Trial, apply, check_ends, recorded_actions
from tttr.engine.replay.mutation import Mutation
from tttr.sessions.vocabulary import RECORDED_LAYERS, Site, site

ONE_AT_A_TIME = "replays run one at a time"
BATCHED = "the layers' replays ran side by side, batched through the engine (sound: the kernels are batch-invariant)"
ONE_LAYER = "one layer to replay: nothing to batch"


@dataclass(slots=True)
class LayerResult:
    layer: str
    deltas: list[Delta]
    trial: Trial | None  # None: no delta in this layer, not replayed

    @property
    def cut(self) -> bool:
        """Its replay stopped before the end (cancelled): it says nothing of the layer."""
        return self.trial is not None and self.trial.extra.get("status", "complete") != "complete"

    @property
    def fixed(self) -> bool | None:
        """Whether GOOD's values of this layer fix BAD; None when not replayed, or cut."""
        return None if self.trial is None or self.cut else not self.trial.failed

    def to_json(self) -> dict:
        return {"layer": self.layer, "deltas": [d.to_json() for d in self.deltas], "fixed": self.fixed,
                "replay": None if self.trial is None else self.trial.to_json()}


@dataclass(slots=True)
class Triage:
    good: int
    bad: int
    judge: str
    layers: list[LayerResult] = field(default_factory=list)  # in RECORDED_LAYERS order
    batched: bool = False
    batch_note: str = ONE_AT_A_TIME

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
                "verdict": self.verdict(), "layers": [r.to_json() for r in self.layers],
                "batched": self.batched, "batch_note": self.batch_note}


def prepare(store, good: int, bad: int, judge: str, *, runtime, unsafe_no_sandbox: bool = False,
            compared: tuple[Pair, list[Delta]] | None = None) -> tuple[Pair, Judge, list[Delta]]:
    """Everything checked before anything is written (a read-only store will do): the pair,
    its deltas (GOOD's values against BAD), GOOD's faithful replay and BAD's failure.
    `compared`: the pair (BAD the base) and its deltas as the run's kind found them
    (engine/kinds.py's `compare`, which a check asks); None: loaded here."""
    pair, found = compared if compared is not None else _compared(store, bad, good)
    the_judge = Judge(judge, tuple(recorded_actions(pair.other)))
    check_ends(store, Pair(pair.other, pair.base), the_judge, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox)
    return pair, the_judge, found


def _compared(store, base: int, other: int) -> tuple[Pair, list[Delta]]:
    pair = Pair.load(store, base, other)
    return pair, differing(pair)


def unreached_clocks(pair: Pair) -> list[Delta]:
    """GOOD's clock at each step where BAD read none (`pair`: BAD the base, GOOD the other: BAD
    never got there, or ended at that step's message), as values a replay of BAD takes if it
    gets there; not deltas (BAD has no value to differ)."""
    reached = {e.step for e in pair.base.events if e.kind == "clock"}
    out = []
    for step in sorted({e.step for e in pair.other.events if e.kind == "clock" and e.step >= 0} - reached):
        value = pair.other.value(site(step, "clock"))
        try:
            t = datetime.fromisoformat(value["t"])
        except (TypeError, KeyError, ValueError):  # a damaged database: that step keeps the made-up clock
            continue
        at = Site(step, "clock")
        out.append(Delta(str(at), "trace", None, value["t"], Mutation(at, t, value["t"])))
    return out


def triage(store, good: int, bad: int, *, judge: str = "outcome", runtime, batch: bool = True,
           unsafe_no_sandbox: bool = False, on_layer: Callable[[LayerResult], None] | None = None,
           cancel: threading.Event | None = None, ray: Callable[[str], Any] | None = None,
           prepared: tuple | None = None) -> Triage:
    """`ray`: the Ray tests of a database (engine/kinds.py's `ray_tests`: each replay a Ray
    task, engine/replay/ray_experiments.py); None: here. `prepared`: what the check's `prepare`
    returned, so GOOD is not replayed faithfully a second time."""
    pair, the_judge, found = (on_store(prepared, store) if prepared is not None else
                              prepare(store, good, bad, judge, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox))
    out = Triage(good, bad, judge)
    choose_batching(out, {pair.base.run.kernel_mode, pair.other.run.kernel_mode}, batch, BATCHED)
    stop = cancel or threading.Event()

    beyond = unreached_clocks(pair)
    if ray is not None:
        tests = ray(store.path)

        def on_ray(subset: list[Delta]) -> Trial:
            return tests.agent(bad, good, subset + beyond, the_judge, model=str(runtime.path),
                               kernel_mode=runtime.kernel_mode, unsafe_no_sandbox=unsafe_no_sandbox, stop=stop)

        return tests.noted(replay_layers(out, found, on_ray, stop=stop, on_layer=on_layer))

    def replay(subset: list[Delta]) -> Trial:
        return apply(store, pair, subset + beyond, the_judge, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox,
                     cancel=stop)

    def replay_aside(subset: list[Delta]) -> Trial:
        from tttr.sessions.store import Store

        with Store.open(store.path, create=False) as own:  # a connection (and a Pair: apply adds to it) per thread
            return apply(own, Pair.load(own, bad, good), subset + beyond, the_judge, runtime=runtime,
                         unsafe_no_sandbox=unsafe_no_sandbox, cancel=stop)

    with runtime.reusing_prefixes():  # the replays of BAD share their live steps' prefixes
        return replay_layers(out, found, replay, replay_aside=replay_aside, stop=stop, on_layer=on_layer)


def replay_layers(out: Triage, found: list[Delta], replay: Callable[[list[Delta]], Trial], *,
                  stop: threading.Event, replay_aside: Callable[[list[Delta]], Trial] | None = None,
                  on_layer: Callable[[LayerResult], None] | None = None) -> Triage:
    """A triage's replays, for any kind of run (the built-in agent's here, a recorded
    program's in engine/program/triage.py): `replay(subset)` once per layer with deltas in
    `found`, in this thread; with `out.batched` and two layers or more, all at once, each
    `replay_aside(subset)` (default `replay`) in a thread of its own. `on_layer` hears of each
    layer as it is done: one at a time in RECORDED_LAYERS order; batched, the layers without
    deltas first, then each replay as it finishes. `out.layers` keeps RECORDED_LAYERS order.
    Ctrl-C, or `on_layer` raising, sets `stop`: the replays in flight end as incomplete runs
    (stored, each still passed to `on_layer`), then the raise goes on."""
    layers = by_layer(found)
    results = {layer: LayerResult(layer, layers[layer], None) for layer in RECORDED_LAYERS}
    todo = [r for r in results.values() if r.deltas]
    if out.batched and len(todo) < 2:
        out.batched, out.batch_note = False, ONE_LAYER
    if out.batched:
        for r in results.values():
            if not r.deltas and on_layer is not None:
                on_layer(r)

        def done(i: int, trial: Trial) -> None:
            todo[i].trial = trial
            if on_layer is not None:
                on_layer(todo[i])

        at_once([partial(replay_aside or replay, r.deltas) for r in todo], stop=stop, on_done=done)
    else:
        for r in results.values():
            if r.deltas:
                r.trial = replay(r.deltas)
            if on_layer is not None:
                on_layer(r)
    out.layers = list(results.values())
    return out
