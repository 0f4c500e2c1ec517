"""One test of an experiment: a replay of a recorded run with a set of deltas applied (the
other run's values at their sites), stored as a child run, and judged.

Everything not in the set stays pinned to the replayed run's recording; a delta applies
where its site exists as the run now unfolds (see `MutationSet`). The seed delta gives the
run the other's seed (its live draws and sandbox randomness); the kernels delta computes
the logits live in the other's kernel mode.

The judge says whether a run "fails": `outcome` — its checker failed; `actions` — its
actions differ from the reference run's (the good one).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

from tttr.engine.replay.deltas import KERNELS, SEED, Delta, Pair, counted, mutation_set
from tttr.engine.replay.steps import action_text
from tttr.engine.replay.oracle import Oracle
from tttr.engine.replay.policy import Policy
from tttr.engine.replay.result import ReplayError
from tttr.engine.replay.runs import _check_model, _drive, _executor_factory, _limits_json, _plan, check_machine
from tttr.engine.replay.source import Source
from tttr.sessions.vocabulary import site_order

JUDGES = ("outcome", "actions")


@dataclass(frozen=True, slots=True)
class Judge:
    how: str
    reference: tuple[str, ...]  # the good run's actions

    def __post_init__(self) -> None:
        if self.how not in JUDGES:
            raise ReplayError(f"unknown judge {self.how!r}: use outcome or actions")

    def fails(self, passed: bool | None, actions: list[str]) -> bool:
        if self.how == "actions":
            return tuple(actions) != self.reference
        return passed is not True


@dataclass(slots=True)
class Trial:
    """A replay with `deltas` applied, as stored, and its verdict."""

    run_id: int | None
    deltas: list[Delta]
    applied: list[str]
    passed: bool | None
    actions: list[str]
    failed: bool
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "deltas": [d.site for d in self.deltas], "applied": self.applied,
                "passed": self.passed, "actions": self.actions, "failed": self.failed}


def recorded_actions(source: Source) -> list[str]:
    return [action_text(e.value) for e in source.events if e.kind == "action"]


def apply(store, pair: Pair, subset: list[Delta], judge: Judge, *, runtime, write: bool = True,
          unsafe_no_sandbox: bool = False, progress: Callable | None = None,
          cancel: threading.Event | None = None) -> Trial:
    """Replay `pair.base` with `subset` (deltas of `pair.other` against it) applied."""
    source, other = pair.base, pair.other
    run = source.run
    _check_model(runtime, run)
    source.manifests.update({k: v for k, v in other.manifests.items() if k not in source.manifests})
    sites = {d.site for d in subset}
    kernel_mode = other.run.kernel_mode if KERNELS in sites else run.kernel_mode
    policy = Policy(frozenset({"tensor"})) if KERNELS in sites else Policy()
    mutations = mutation_set(subset)
    plan = _plan(source, Policy(), None, None)
    seed = other.run.seed if SEED in sites else plan.seed
    check_machine(runtime, unsafe_no_sandbox, commands=bool(subset))
    present = [m for m in mutations.mutations if str(m.site) in source.by_site]
    first = min(present, key=lambda m: site_order(str(m.site)), default=None)
    fork_seq = source.seq_of(str(first.site)) if first is not None and not (sites & {SEED, KERNELS}) else 0
    meta = {"clock": plan.base.isoformat(), "limits": _limits_json(plan.limits),
            "sandbox": runtime.sandbox_mechanisms(unsafe_no_sandbox),
            "experiment": {"deltas_from": other.run.id, "sites": sorted(sites, key=site_order)}}
    settings = dict(
        task=run.task, model_id=run.model_id, kernel_mode=kernel_mode, sampling=run.sampling, seed=seed,
        fingerprint=runtime.fingerprint(), parent=run.id, fork_seq=fork_seq,
        fork_site=str(first.site) if fork_seq else None,
        mutation={"site": str(first.site) if first else None, "value": counted(len(subset)),
                  "input": f"{counted(len(subset))} from run {other.run.id}: "
                           + ", ".join(sorted(sites, key=site_order)),
                  "deltas": mutations.to_json()} if subset else None,
        meta=meta,
    )
    oracle = Oracle(
        store=store, run_id=None, begin=lambda: store.begin_run(**settings), task=plan.task,
        tokenizer=runtime.tokenizer, generate=runtime.generate_in(kernel_mode),
        make_sequence=runtime.sequence_factory(plan.sampling), policy=policy, seed=seed,
        kernel_mode=kernel_mode, clock_base=plan.base, executor_factory=_executor_factory(unsafe_no_sandbox),
        source=source, mutation=mutations, fork_seq=fork_seq, write=write, progress=progress, cancel=cancel,
        max_steps=plan.limits.max_steps,
    )
    _drive(oracle, plan.task.instruction, plan.limits)
    passed = None if oracle.outcome is None else oracle.outcome.passed
    return Trial(oracle.run_id if write else None, list(subset), list(mutations.applied), passed,
                 list(oracle.actions), judge.fails(passed, oracle.actions) if oracle.status == "complete" else True,
                 {"status": oracle.status})


def check_ends(store, pair_good: Pair, judge: Judge, *, runtime, unsafe_no_sandbox: bool = False) -> None:
    """GOOD passes its own judge on a faithful replay (written nowhere), and BAD fails it:
    ReplayError in one line otherwise."""
    good, bad = pair_good.base.run, pair_good.other.run
    trial = apply(store, pair_good, [], judge, runtime=runtime, write=False, unsafe_no_sandbox=unsafe_no_sandbox)
    if trial.failed:
        raise ReplayError(f"run {good.id} (GOOD) fails its own check on a faithful replay "
                          f"({'outcome ' + str(trial.passed) if judge.how == 'outcome' else 'its actions changed'}): "
                          "give a GOOD run that passes")
    bad_outcome = pair_good.other.outcome()
    if not judge.fails(None if bad_outcome is None else bad_outcome.passed, recorded_actions(pair_good.other)):
        what = "passed its check" if judge.how == "outcome" else "took the same actions as GOOD"
        hint = "; compare their actions with --judge actions" if judge.how == "outcome" else ""
        raise ReplayError(f"run {bad.id} (BAD) {what}: there is no failure to locate{hint}")
