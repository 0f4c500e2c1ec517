"""Record, replay and fork agent runs: each sets up an oracle and drives the one agent loop.
This is the built-in agent's kind (engine/kinds.py's AgentRuns); a run of another kind is
replayed by its own (served calls: engine/replay/calls.py), and refused here.

- `record`: every layer free, no source; the run is new.
- `replay`: the source's values pinned, except for the freed layers; the replay is stored as
  a child run of the source (`meta.replay.free`), with its own events.
- `fork`: a faithful replay with one mutation; the child shares the parent's events before
  the fork site (nothing is copied) and is live after it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from tttr.engine.replay.agent import AgentLimits, run_agent
from tttr.engine.replay.steps import action_text
from tttr.engine.replay.mutation import Mutation, parse_mutation
from tttr.engine.replay.oracle import Oracle
from tttr.engine.replay.policy import Policy
from tttr.engine.replay.result import ReplayError, RunResult, kernels_note, same_outcome
from tttr.engine.replay.runtime import Runtime
from tttr.engine.replay.source import Source
from tttr.recorders.clock import normalize_clock
from tttr.recorders.errors import SandboxError, TaskError
from tttr.recorders.probe import probe
from tttr.recorders.sandbox import REFUSAL, Executor
from tttr.recorders.tasks import load_task
from tttr.sessions.values import ValueProblem, load_json
from tttr.sessions.vocabulary import SETUP_STEP, site


def _fresh_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


NAME_MAX = 255  # bytes in a file name: a longer task name names no task folder


def _load_task(name: str):
    """The task a run names. A name longer than a file name (a database may say anything) is
    an unknown task, not an OSError from looking for its folder."""
    if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX:
        raise TaskError(f"unknown task {name[:60]!r}… ({len(name)} characters): no task folder can have this name; "
                        "`tttr tasks` lists the tasks")
    return load_task(name)


def _executor_factory(unsafe_no_sandbox: bool) -> Callable:
    def make(tree_dir, seed):
        return Executor(tree_dir, seed=seed, unsafe_no_sandbox=unsafe_no_sandbox)

    return make


def _check_model(runtime: Runtime, run) -> None:
    if run.model_id != runtime.model_id:
        raise ReplayError(
            f"run {run.id} was recorded with model {run.model_id}, but the loaded model is "
            f"{runtime.model_id}: pass the same model with --model (or TTTR_MODEL)"
        )


def _drive(oracle: Oracle, instruction: str, limits: AgentLimits) -> None:
    try:
        run_agent(oracle, instruction, limits)
    except BaseException as exc:
        # A run that dies half way is kept, marked incomplete, never silently complete.
        if oracle.status == "recording" and not oracle.begun:
            oracle.discard()  # it failed before its first step was written: leave no run behind
        elif oracle.status == "recording":
            try:
                oracle.abort(f"{type(exc).__name__}: {exc}")
            except Exception:  # noqa: BLE001 - the original error matters more
                pass
        raise


def record(
    store,
    task_name: str,
    *,
    runtime: Runtime | None = None,
    seed: int | None = None,
    temperature: float = 0.7,
    top_p: float = 1.0,
    top_k: int = 0,
    clock: datetime | None = None,
    unsafe_no_sandbox: bool = False,
    limits: AgentLimits = AgentLimits(),
    progress: Callable | None = None,
    cancel: threading.Event | None = None,
    write: bool = True,
    meta: dict | None = None,
) -> RunResult:
    """Run the agent on a task with every layer live, recording it (unless write=False,
    which is the same run with recording switched off: the baseline for its overhead).
    `meta` is merged into the run's meta (e.g. a suite's id and condition)."""
    from tttr.engine.inference.sampler import SamplingParams  # lazy: torch, which a faithful replay never loads

    runtime = runtime or Runtime()
    task = _load_task(task_name)
    seed = _fresh_seed() if seed is None else seed
    sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    base = clock or getattr(task, "clock", None) or datetime.now(timezone.utc).replace(tzinfo=None)
    base = sandbox_clock(base, "the starting clock")  # refused here, before the run is begun
    check_machine(runtime, unsafe_no_sandbox)
    settings = dict(
        task=task.name, model_id=runtime.model_id, kernel_mode=runtime.kernel_mode,
        sampling={"temperature": temperature, "top_p": top_p, "top_k": top_k},
        seed=seed, fingerprint=runtime.fingerprint(),
        meta={"clock": base.isoformat(), "limits": _limits_json(limits),
              "sandbox": runtime.sandbox_mechanisms(unsafe_no_sandbox), **(meta or {})},
    )
    oracle = Oracle(
        store=store, run_id=None, begin=lambda: store.begin_run(**settings), task=task, tokenizer=runtime.tokenizer,
        generate=runtime.generate, make_sequence=runtime.sequence_factory(sampling),
        policy=Policy.record(), seed=seed, kernel_mode=runtime.kernel_mode, clock_base=base,
        executor_factory=_executor_factory(unsafe_no_sandbox), write=write,
        progress=progress, cancel=cancel, max_steps=limits.max_steps,
    )
    with runtime.reusing_prefixes():  # step k's prompt is step k-1's and then some: prefilled once
        _drive(oracle, task.instruction, limits)
    return RunResult(oracle.run_id, oracle.status, oracle.outcome, oracle.actions,
                     logits_computed=oracle.logits_computed, commands_run=oracle.commands_run)


def _limits_json(limits: AgentLimits) -> dict:
    return {k: getattr(limits, k) for k in limits.__slots__}


def check_machine(runtime: Runtime, unsafe_no_sandbox: bool, *, commands: bool = True) -> None:
    """The model's tokenizer loads and (when the run will run commands) the sandbox works
    here: checked before a run is begun, so that neither can leave an incomplete run behind
    at its first use. A faithful replay runs no command."""
    runtime.tokenizer  # noqa: B018 - reads the model file's vocabulary; a bad file fails here
    if commands and not unsafe_no_sandbox:
        support = probe()
        if not support.ok:
            raise ReplayError(f"{support.line()}; {REFUSAL}")


def sandbox_clock(t: datetime, what: str) -> datetime:
    """`t` if the sandbox's virtual clock can show it, else ReplayError, so that a run is
    refused before it begins rather than dying at its first command."""
    try:
        return normalize_clock(t)
    except SandboxError as exc:
        raise ReplayError(f"{what} {exc.args[0].removeprefix('bad clock ')}") from None


@dataclass(slots=True)
class _Plan:
    """Everything a child run needs, worked out (and so checked) before it is begun."""

    task: Any
    seed: int
    sampling: Any
    limits: AgentLimits
    base: datetime
    fork_seq: int


def _plan(source: Source, policy: Policy, mutation: Mutation | None, seed: int | None) -> _Plan:
    """Check the source run as a whole and derive the child's settings; raises before any write.

    What the replay will feed the sandbox and the sampler is checked here: the task exists,
    the sampling parameters and limits are valid, every recorded clock is one the virtual
    clock can show, and every blob and snapshot the run refers to can be read."""
    from tttr.engine.inference.sampler import SamplingParams  # lazy: torch, which a faithful replay never loads

    run = source.run
    if type(run.task) is not str:
        raise ReplayError(f"run {run.id} names no task: it cannot be replayed")
    task = _load_task(run.task)
    if policy.pinned("token"):
        seed = run.seed
    elif seed is None:
        seed = _fresh_seed()
    params = dict(run.sampling)
    try:
        sampling = SamplingParams(temperature=params.get("temperature", 0.0), top_p=params.get("top_p", 1.0),
                                  top_k=params.get("top_k", 0), seed=seed if seed is not None else 0)
        limits = AgentLimits(**{k: v for k, v in run.meta.limits.items() if k in AgentLimits.__slots__})
    except (ValueError, TypeError) as exc:
        raise ReplayError(f"run {run.id}: its recorded settings cannot be used: {exc}") from None
    if seed is None:
        raise ReplayError(f"run {run.id} has no recorded seed: replay it with --free token")
    _check_values(source)
    if policy.pinned("trace"):
        recorded = run.meta.clock or (source.value(site(SETUP_STEP, "clock")) or {}).get("t")
        if recorded is None:
            raise ReplayError(f"run {run.id} has no starting clock (meta.clock or setup:clock): replay it with --free trace")
        base = sandbox_clock(datetime.fromisoformat(recorded), f"run {run.id}: its starting clock")
    else:
        base = datetime.now(timezone.utc).replace(tzinfo=None)
    fork_seq = source.seq_of(mutation.first_site) if mutation is not None else 0
    return _Plan(task, seed, sampling, limits, base, fork_seq)


def _check_values(source: Source) -> None:
    """Recorded values the store accepts by shape but the replay would fail on half way."""
    store, rid = source.store, source.run.id
    for e in source.events:
        v = e.value
        if e.kind == "clock":
            sandbox_clock(datetime.fromisoformat(v["t"]), f"run {rid}, site {e.site}: the clock")
        elif e.kind in ("setup", "tool"):
            refs = [v.get(k) for k in ("stdout", "stderr") if isinstance(v.get(k), dict)]
            try:
                for ref in refs:
                    store.get_blob(ref["$blob"])  # bounded and checked against its digest
                snapshot = v.get("snapshot")
                if snapshot:
                    if not store.has_blob(snapshot):
                        raise ReplayError(f"its snapshot {snapshot[:16]}… is not in the file")
                    try:  # restoring it is the sandbox's business; it must at least be JSON of sane depth
                        load_json(store.get_blob(snapshot), "its snapshot manifest")
                    except ValueProblem as exc:
                        raise ReplayError(str(exc)) from None
            except ReplayError as exc:
                raise ReplayError(f"run {rid}, site {e.site}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - StoreError and kin: say where
                if getattr(exc, "exit_code", None) is None:
                    raise
                raise ReplayError(f"run {rid}, site {e.site}: {exc}") from None


def _child(store, source: Source, runtime: Runtime, *, policy: Policy, mutation: Mutation | None, plan: _Plan,
           progress, cancel, unsafe_no_sandbox: bool, meta_extra: dict | None = None) -> RunResult:
    run = source.run
    task, seed, sampling, limits, base, fork_seq = (plan.task, plan.seed, plan.sampling, plan.limits,
                                                   plan.base, plan.fork_seq)
    meta = {"clock": base.isoformat(), "limits": _limits_json(limits),
            "sandbox": runtime.sandbox_mechanisms(unsafe_no_sandbox)}
    if mutation is None:
        meta["replay"] = {"free": sorted(policy.free)}
    meta.update(meta_extra or {})
    kernel_mode = run.kernel_mode
    settings = dict(
        task=run.task, model_id=run.model_id, kernel_mode=kernel_mode,
        sampling=run.sampling, seed=seed, fingerprint=runtime.fingerprint(),
        parent=run.id, fork_seq=fork_seq,
        fork_site=str(mutation.site) if mutation else None,
        mutation=mutation.to_json() if mutation else None, meta=meta,
    )
    # Begun at its first commit: a fork whose shared prefix does not replay leaves no run.
    oracle = Oracle(
        store=store, run_id=None, begin=lambda: store.begin_run(**settings), task=task, tokenizer=runtime.tokenizer,
        generate=runtime.generate_in(kernel_mode), make_sequence=runtime.sequence_factory(sampling),
        policy=policy, seed=seed, kernel_mode=kernel_mode, clock_base=base,
        executor_factory=_executor_factory(unsafe_no_sandbox), source=source, mutation=mutation,
        fork_seq=fork_seq, progress=progress, cancel=cancel, max_steps=limits.max_steps,
    )
    with runtime.reusing_prefixes():  # each live step's prompt extends the one before it
        _drive(oracle, task.instruction, limits)
    notes = []
    if oracle.logits_computed:
        note = kernels_note(run.fingerprint or {})
        if note:
            notes.append(note)
    # Decisions: the actions taken and every token chosen. A live value that differs without
    # changing a decision (a live clock, say) is still reported as the divergence.
    identical = (oracle.actions == _recorded_actions(source)
                 and oracle.token_ids == [t["id"] for e in source.events if e.kind == "token" for t in [e.value]])
    recorded = source.outcome()
    return RunResult(oracle.run_id, oracle.status, oracle.outcome, oracle.actions, identical=identical,
                     divergence=oracle.divergence, same_outcome=same_outcome(recorded, oracle.outcome),
                     parent=run.id,
                     logits_computed=oracle.logits_computed, commands_run=oracle.commands_run,
                     extra={"recorded_outcome": None if recorded is None else recorded.to_json(),
                            **({"notes": notes} if notes else {})})


def _recorded_actions(source: Source) -> list[str]:
    return [action_text(e.value) for e in source.events if e.kind == "action"]


@dataclass(frozen=True, slots=True)
class AgentPlan:
    """A replay or fork of an agent run, checked read-only: the decoded recording, the parsed
    change (None for a replay), the child's settings (task, seed, sampling, limits, clock,
    fork point) and how it runs. `act` carries it out on a store opened for writing, reading
    and checking nothing of the run again."""

    source: Source
    policy: Policy
    mutation: Mutation | None
    settings: _Plan
    runtime: Runtime
    unsafe_no_sandbox: bool = False

    def act(self, store, *, progress=None, cancel=None, meta: dict | None = None) -> RunResult:
        """`meta` is merged into the child's meta (e.g. a suite's id and condition)."""
        return _child(store, self.source.on(store), self.runtime, policy=self.policy, mutation=self.mutation,
                      plan=self.settings, progress=progress, cancel=cancel,
                      unsafe_no_sandbox=self.unsafe_no_sandbox, meta_extra=meta)


def check_replay(store, run_id: int, free=(), *, runtime: Runtime, unsafe_no_sandbox: bool = False,
                 seed: int | None = None) -> AgentPlan:
    """Everything `replay` checks before it writes, on any store (a read-only one too); the
    plan to act on (`plan.act(store)`, on a store opened for writing)."""
    policy = Policy(frozenset(free)) if not isinstance(free, Policy) else free
    source = Source(store, run_id)
    _check_source(source)
    _check_model(runtime, source.run)
    settings = _plan(source, policy, None, seed)
    check_machine(runtime, unsafe_no_sandbox, commands=not policy.faithful)
    return AgentPlan(source, policy, None, settings, runtime, unsafe_no_sandbox)


def check_fork(store, run_id: int, site: str, value: str, *, runtime: Runtime,
               unsafe_no_sandbox: bool = False) -> AgentPlan:
    """Everything `fork` checks before it writes, on any store (a read-only one too): the
    source run, the model, the site and the new value (parsed here, once); the plan to act on."""
    source = Source(store, run_id)
    _check_source(source)
    _check_model(runtime, source.run)
    mutation = parse_mutation(store, run_id, site, value, tokenizer=runtime.tokenizer)
    _check_mutation_site(source, mutation)
    settings = _plan(source, Policy(), mutation, None)
    check_machine(runtime, unsafe_no_sandbox)
    return AgentPlan(source, Policy(), mutation, settings, runtime, unsafe_no_sandbox)


def replay(store, run_id: int, free=(), *, runtime: Runtime | None = None, progress=None, cancel=None,
           unsafe_no_sandbox: bool = False, seed: int | None = None, meta: dict | None = None) -> RunResult:
    """Check, then act on the same store. `meta` is merged into the replay's meta (e.g. a
    suite's id and condition)."""
    runtime = runtime or Runtime(kernel_mode=store.run(run_id).kernel_mode)
    plan = check_replay(store, run_id, free, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox, seed=seed)
    return plan.act(store, progress=progress, cancel=cancel, meta=meta)


def fork(store, run_id: int, site: str, value: str, *, runtime: Runtime | None = None, progress=None,
         cancel=None, unsafe_no_sandbox: bool = False) -> RunResult:
    runtime = runtime or Runtime(kernel_mode=store.run(run_id).kernel_mode)
    plan = check_fork(store, run_id, site, value, runtime=runtime, unsafe_no_sandbox=unsafe_no_sandbox)
    return plan.act(store, progress=progress, cancel=cancel)


def _check_source(source: Source) -> None:
    if source.run.meta.kind != "agent":  # its kind replays it (tttr.engine.kinds.kind_of): not the agent's loop
        raise ReplayError(f"run {source.run.id} is not the built-in agent's (its kind: {source.run.meta.kind}): "
                          "ask its kind to replay or fork it (tttr.engine.kinds.kind_of), as tttr replay and tttr fork do")
    if source.run.status != "complete":
        raise ReplayError(
            f"run {source.run.id} is {source.run.status}: only complete runs can be replayed or forked"
        )


def _check_mutation_site(source: Source, mutation: Mutation) -> None:
    """What the oracle needs at the site to apply the mutation is in the recording."""
    site = mutation.site
    if site.name == "token":
        if f"{site.step}:prompt" not in source.by_site or f"{site.step}:logits:{site.pos}" not in source.by_site:
            raise ReplayError(f"run {source.run.id} has no prompt or logits recorded for {site}: it cannot be forked there")
    if site.name == "message" and f"{site.step}:prompt" not in source.by_site:
        raise ReplayError(f"run {source.run.id} has no prompt recorded for {site}: it cannot be forked there")
    if site.name == "tool" and source.value(str(site)) is None:
        raise ReplayError(f"run {source.run.id} has no tool result recorded at {site} to change")
