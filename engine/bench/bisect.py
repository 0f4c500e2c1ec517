"""`tttr bench bisect`: triage and bisect against causes planted where they are known.

The default model solves few tasks, so the pairs are built from recorded runs by forking, as
the triage test does. Each plant is one cause, planted in a passing run GOOD by forking it;
BAD is the fork. Beside the cause, each other step's clock is shifted by an hour first
(innocent deltas, each checked to leave the run passing), so that bisect has more than one
delta to search; the tool plant has none (its run has one tool step, and a tool result is a
delta only where both runs read the same clock). The kinds, those of the values a fork edits:

- `clock` (trace): `today-report`, recorded with a seed whose run never creates today's
  report, made to pass by moving its last step's clock back a day (the checker then runs on
  the day whose report the setup made); the cause moves that clock forward again.
- `tool` (trace): a passing `write-line` run's first tool result replaced by an error, so
  that the model, reading it, goes on differently (the file it wrote stays as it was: a
  changed result changes what the agent reads, not the sandbox).
- `token` (token): a token of that run's first command replaced by the runner-up of its
  recorded logits, at the first position where that makes the run fail.

A plant whose fork does not fail (or an innocent shift that breaks GOOD) is discarded and
counted. Then, per kept plant: `triage GOOD BAD` must name exactly the planted layer, and
`bisect GOOD BAD` must find exactly the planted site; bisect runs with its independent tests
batched (invariant kernels) and one at a time, twice each (the faster run of each counts), for
`batched_speedup` (over the plants with two or more deltas: with one, bisect replays the whole
set only, and there is nothing to batch).
`mean_replays` stands beside ddmin's bound for a single cause, `2*log2(n)+2` for n deltas.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

from tttr.engine.replay.agent import AgentLimits
from tttr.engine.replay.bisect import bisect
from tttr.engine.replay.runs import fork, record
from tttr.engine.replay.runtime import Runtime
from tttr.engine.replay.triage import triage
from tttr.sessions.errors import TTTRError
from tttr.sessions.store import Store
from tttr.sessions.vocabulary import KIND_LAYER, site

KINDS = ("clock", "tool", "token")  # a plant is named after the kind of value its fork replaces
TARGETS = {"triage_layer_correct_fraction": 1.0, "bisect_found_fraction": 1.0, "batched_speedup": 2.0}
LIMITS = AgentLimits()  # as `tttr record` runs the agent: today-report then has 6 steps, so n = 6 for its plant
DATE_TASK, DATE_SEED = "today-report", 2  # the triage test's pair: its steps never create today's report
TOOL_TASK, TOOL_SEEDS = "write-line", (2, 4, 5, 6)  # recorded in turn until one passes
INNOCENT = "+1h"
TOOL_VALUES = ('{"stdout": "", "stderr": "greeting.txt: No such file or directory", "exit_code": 2}',
               "rm: greeting.txt: file is corrupt, delete it")  # tried in turn: the first that makes the run fail
TOKEN_POSITIONS = 12  # positions of the first command tried, in order
# Each bisect runs twice per mode, in this order, and the faster of the two counts: the machine
# is shared, and one run's time can double with the load (the same work took 6 and 9 s).
ORDER = (True, False, False, True)  # batched, one at a time, one at a time, batched


class BenchError(TTTRError):
    """The bench could not measure (no passing run to plant in, no plant that failed): one line."""

    exit_code = 1


@dataclass(frozen=True, slots=True)
class Plant:
    """A planted cause: BAD is GOOD forked (after the innocent shifts) at `site` with `value`."""

    kind: str
    task: str
    good: int
    bad: int
    site: str
    value: str

    @property
    def layer(self) -> str:
        return KIND_LAYER[self.kind]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What triage and bisect said about one plant."""

    plant: Plant
    deltas: int  # n: the differences between GOOD and BAD
    culprits: tuple[str, ...]  # triage's
    found: tuple[str, ...]  # the sites of bisect's minimal set
    replays: int  # bisect's, tests batched
    replays_one_at_a_time: int
    batched_s: float
    one_at_a_time_s: float
    runs: tuple[int, ...] = ()  # the stored replays of triage and both bisects

    def __post_init__(self) -> None:
        if self.deltas < 1 or self.replays < 1 or self.replays_one_at_a_time < 1:
            raise ValueError(f"Outcome needs n >= 1 deltas and >= 1 replays, got {self.deltas}, "
                             f"{self.replays}, {self.replays_one_at_a_time}")
        if not (self.batched_s > 0 and self.one_at_a_time_s > 0):
            raise ValueError(f"Outcome needs positive times, got {self.batched_s}, {self.one_at_a_time_s}")

    @property
    def triage_correct(self) -> bool:
        return self.culprits == (self.plant.layer,)

    @property
    def bisect_found(self) -> bool:
        return self.found == (self.plant.site,)

    @property
    def bound(self) -> float:
        return replay_bound(self.deltas)

    def to_json(self) -> dict:
        p = self.plant
        return {"kind": p.kind, "task": p.task, "layer": p.layer, "site": p.site, "value": p.value,
                "good": p.good, "bad": p.bad, "deltas": self.deltas, "culprits": list(self.culprits),
                "triage_correct": self.triage_correct, "found": list(self.found), "bisect_found": self.bisect_found,
                "replays": self.replays, "replays_one_at_a_time": self.replays_one_at_a_time,
                "replay_bound": round(self.bound, 2), "batched_s": round(self.batched_s, 3),
                "one_at_a_time_s": round(self.one_at_a_time_s, 3), "runs": list(self.runs)}


def replay_bound(n: int) -> float:
    """ddmin's replays for a single cause among n deltas, the whole set's test included."""
    return 2 * math.log2(n) + 2


@dataclass(frozen=True, slots=True)
class Figures:
    outcomes: tuple[Outcome, ...]
    tried: int  # plant forks made (innocent shifts included)
    discarded: int  # of those, the ones that did not fail (or, innocent, did)

    def __post_init__(self) -> None:
        if not self.outcomes:
            raise ValueError("Figures needs at least one kept plant")

    def to_json(self) -> dict:
        o = self.outcomes
        n = len(o)
        rounds = [x for x in o if x.deltas >= 2]  # with one delta bisect tests the whole set only: nothing to batch
        batched, one = sum(x.batched_s for x in rounds), sum(x.one_at_a_time_s for x in rounds)
        return {
            "plants": n, "tried": self.tried, "discarded": self.discarded,
            "kinds": sorted({x.plant.kind for x in o}),
            "triage_layer_correct_fraction": sum(x.triage_correct for x in o) / n,
            "bisect_found_fraction": sum(x.bisect_found for x in o) / n,
            "mean_deltas": sum(x.deltas for x in o) / n,
            "mean_replays": sum(x.replays for x in o) / n,
            "mean_replays_one_at_a_time": sum(x.replays_one_at_a_time for x in o) / n,
            "mean_replay_bound": sum(x.bound for x in o) / n,
            "within_bound_fraction": sum(x.replays <= x.bound for x in o) / n,
            "speedup_plants": len(rounds),
            "batched_speedup": round(one / batched, 3) if rounds else None,
            # seconds per replay, one at a time over batched: what batching buys a test, apart from
            # the extra tests a batched round runs that one-at-a-time ddmin skips
            "per_replay_speedup": round(one / sum(x.replays_one_at_a_time for x in rounds)
                                        / (batched / sum(x.replays for x in rounds)), 3) if rounds else None,
            "batched_s": round(batched, 3), "one_at_a_time_s": round(one, 3),
            "outcomes": [x.to_json() for x in o],
        }


def format_report(r: dict) -> str:
    """The bench's lines, each figure with its target."""
    per = "; ".join(f"{x['kind']} at {x['site']} (n={x['deltas']}): triage {'+'.join(x['culprits']) or 'none'}, "
                    f"bisect {', '.join(x['found']) or 'nothing'} in {x['replays']} replays"
                    for x in r["outcomes"])
    return "\n".join([
        f"bisect bench: {r['plants']} planted causes kept of {r['tried']} forks tried ({r['discarded']} discarded: "
        f"the fork did not fail, or an innocent shift did): {per}",
        f"triage_layer_correct_fraction {r['triage_layer_correct_fraction']:.2f} "
        f"(target {TARGETS['triage_layer_correct_fraction']:.1f}); bisect_found_fraction "
        f"{r['bisect_found_fraction']:.2f} (target {TARGETS['bisect_found_fraction']:.1f})",
        f"mean_replays {r['mean_replays']:.2f} batched, {r['mean_replays_one_at_a_time']:.2f} one at a time, "
        f"beside 2*log2(n)+2 = {r['mean_replay_bound']:.2f} on average for n = "
        f"{', '.join(str(x['deltas']) for x in r['outcomes'])} deltas (target: at or below, per plant; "
        f"{r['within_bound_fraction']:.0%} of plants are)",
        _speedup_line(r),
    ])


def _speedup_line(r: dict) -> str:
    target = f"(target >= {TARGETS['batched_speedup']:.0f}x)"
    if r["batched_speedup"] is None:
        return f"batched_speedup n/a {target}: no plant has 2 or more deltas, so no bisect round had tests to batch"
    return (f"batched_speedup {r['batched_speedup']:.2f}x {target} over the {r['speedup_plants']} plant(s) with 2 or "
            f"more deltas: bisect {r['one_at_a_time_s']:.2f} s one at a time, {r['batched_s']:.2f} s batched; "
            f"per replay {r['per_replay_speedup']:.2f}x (batched rounds test parts that one at a time skips)")


# ---------------------------------------------------------------------------- planting
class _Planter:
    def __init__(self, store, runtime, unsafe_no_sandbox: bool, say: Callable[[str], None]):
        self.store, self.runtime, self.unsafe = store, runtime, unsafe_no_sandbox
        self.say = say
        self.tried = self.discarded = 0

    def fork(self, run_id: int, at: str, value: str, *, should_pass: bool):
        """A fork counted as tried; None (and counted as discarded) unless its outcome is as wanted."""
        self.tried += 1
        res = fork(self.store, run_id, at, value, runtime=self.runtime, unsafe_no_sandbox=self.unsafe)
        if (res.passed is True) == should_pass:
            return res
        self.discarded += 1
        self.say(f"  discarded: run {run_id} forked at {at} = {value} {'failed' if should_pass else 'still passed'}")
        return None

    def tool_steps(self, run_id: int) -> list[int]:
        return sorted({e.step for e in self.store.events(run_id, kind="tool")})

    def innocents(self, run_id: int, steps: list[int]) -> int:
        """`run_id` with every given step's clock shifted by an hour, where the run still passes."""
        for step in steps:
            res = self.fork(run_id, site(step, "clock"), INNOCENT, should_pass=True)
            if res is not None:
                run_id = res.run_id
        return run_id

    def plant(self, kind: str, task: str, good: int, at: str, values, *, base: int | None = None) -> Plant | None:
        """GOOD, or `base` (GOOD with the innocent shifts), forked at `at` with the first value that fails."""
        base = good if base is None else base
        for value in values:
            res = self.fork(base, at, value, should_pass=False)
            if res is not None:
                self.say(f"  planted {kind}: run {base} (passes) forked at {at} = {value} → run {res.run_id} fails")
                return Plant(kind, task, good, res.run_id, at, value)
        return None


def _passing(store, runtime, unsafe: bool, say) -> int:
    for seed in TOOL_SEEDS:
        res = record(store, TOOL_TASK, runtime=runtime, seed=seed, limits=LIMITS, unsafe_no_sandbox=unsafe)
        say(f"  recorded {TOOL_TASK} seed {seed}: run {res.run_id} {'passed' if res.passed else 'failed'}")
        if res.passed:
            return res.run_id
    raise BenchError(f"no recording of {TOOL_TASK} with seeds {TOOL_SEEDS} passed: nothing to plant a cause in")


def _clock_plant(p: _Planter) -> Plant | None:
    bad = record(p.store, DATE_TASK, runtime=p.runtime, seed=DATE_SEED, limits=LIMITS, unsafe_no_sandbox=p.unsafe)
    steps = p.tool_steps(bad.run_id)
    p.say(f"  recorded {DATE_TASK} seed {DATE_SEED}: run {bad.run_id} ({len(steps)} tool steps)")
    if not steps:
        return None
    last = site(steps[-1], "clock")
    good = p.fork(bad.run_id, last, "-1d", should_pass=True)  # the checker's day: the one whose report exists
    if good is None:
        return None
    shifted = p.innocents(good.run_id, steps[:-1])
    return p.plant("clock", DATE_TASK, good.run_id, last, ["+1d"], base=shifted)


def _tool_plant(p: _Planter, good: int) -> Plant | None:
    steps = p.tool_steps(good)
    return p.plant("tool", TOOL_TASK, good, site(steps[0], "tool"), TOOL_VALUES) if steps else None


def _token_plant(p: _Planter, good: int) -> Plant | None:
    steps = p.tool_steps(good)
    if not steps:
        return None
    shifted = p.innocents(good, steps)
    step = steps[0]
    flips = [(pos, alt) for pos in range(TOKEN_POSITIONS) if (alt := runner_up(p.store, shifted, step, pos)) is not None]
    for pos, alt in flips:
        plant = p.plant("token", TOOL_TASK, good, site(step, "token", pos), [str(alt)], base=shifted)
        if plant is not None:
            return plant
    return None


def runner_up(store, run_id: int, step: int, pos: int) -> int | None:
    """The best-ranked token of the recorded logits at a position other than the recorded one."""
    logits, token = store.event_at(run_id, site(step, "logits", pos)), store.event_at(run_id, site(step, "token", pos))
    if logits is None or token is None:
        return None
    return next((i for i, _ in logits.value.get("topk", []) if i != token.value["id"]), None)


# ---------------------------------------------------------------------------- measuring
def _judge(store, plant: Plant, runtime, unsafe: bool, say) -> Outcome:
    t = triage(store, plant.good, plant.bad, runtime=runtime, unsafe_no_sandbox=unsafe)
    say(f"  triage {plant.kind}: {t.verdict()}")
    timed: dict[bool, list] = {True: [], False: []}
    for batch in ORDER:
        began = time.perf_counter()
        b = bisect(store, plant.good, plant.bad, runtime=runtime, batch=batch, unsafe_no_sandbox=unsafe)
        timed[batch].append((time.perf_counter() - began, b))
        say(f"  bisect {plant.kind} ({'batched' if b.batched else 'one at a time'}): "
            f"{', '.join(d.site for d in b.result.items)} in {b.replays} replays, {timed[batch][-1][0]:.2f} s")
    (_, b), (_, one) = timed[True][0], timed[False][0]
    fast_s, slow_s = min(s for s, _ in timed[True]), min(s for s, _ in timed[False])
    if not b.batched:
        raise BenchError(f"bisect did not batch: {b.batch_note}")
    runs = [r.trial.run_id for r in t.layers if r.trial is not None] + [
        x.run_id for batch in (True, False) for _, done in timed[batch] for x in done.trials]
    return Outcome(plant, len(b.deltas), tuple(t.culprits), tuple(d.site for d in b.result.items),
                   b.replays, one.replays, fast_s, slow_s, tuple(runs))


def measure(*, kinds: tuple[str, ...] = KINDS, db: str | None = None, model: str | None = None,
            unsafe_no_sandbox: bool = False, progress: Callable[[str], None] = lambda text: None) -> Figures:
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown plant kinds {unknown}: use {', '.join(KINDS)}")
    tmp = None
    if db is None:
        tmp = tempfile.mkdtemp(prefix="tttr-bench-bisect-")
        db = os.path.join(tmp, "bisect.db")
    runtime = Runtime(model, kernel_mode="invariant")
    try:
        with Store.open(db, create=True) as store:
            p = _Planter(store, runtime, unsafe_no_sandbox, progress)
            progress("recording the runs to plant causes in …")
            good = _passing(store, runtime, unsafe_no_sandbox, progress) if {"tool", "token"} & set(kinds) else None
            plants = []
            for kind in kinds:
                plant = {"clock": lambda: _clock_plant(p), "tool": lambda: _tool_plant(p, good),
                         "token": lambda: _token_plant(p, good)}[kind]()
                if plant is None:
                    progress(f"  no {kind} plant made its run fail: left out")
                else:
                    plants.append(plant)
            if not plants:
                raise BenchError(f"none of the {p.tried} planted forks failed: nothing to triage")
            outcomes = []
            for plant in plants:
                progress(f"triage and bisect of the {plant.kind} plant (GOOD {plant.good}, BAD {plant.bad}) …")
                outcomes.append(_judge(store, plant, runtime, unsafe_no_sandbox, progress))
        return Figures(tuple(outcomes), p.tried, p.discarded)
    finally:
        runtime.close()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def run_bench(**kw) -> dict:
    return measure(**kw).to_json()
