"""A run's kind: what recorded it, and how each verb is done for it.

A run is one of three kinds today: the built-in agent on a task (`tttr record --task`), a set
of served API calls (`tttr serve --db`), and a user's program (`tttr record -- PROGRAM`). A
command asks `kind_of(run)` once and calls the kind, as rr's record, replay and diversion are
kinds of one session: `check_replay` / `check_fork` read the database (read-only) and check
everything the verb needs into a plan, refusing bad input before anything is written;
`replay` / `fork` act on that plan. A fourth kind (a trace imported from elsewhere) is one
more class here and the module that does its work.

The kinds hold no printing: what a command prints of a result is the app's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from tttr.engine.replay import steps as _steps
from tttr.sessions.errors import TTTRError

if TYPE_CHECKING:  # what every kind's record, replay and fork return (a subclass per kind's own facts)
    from tttr.engine.replay.result import RunResult


class KindError(TTTRError):
    """A verb or an option that this kind of run does not take."""


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """What a replay is asked for: the layers to free (a Policy), the seed of a freed token
    layer, the model for what is computed live, a program's `--code DIR`, and the sandbox."""

    policy: Any
    seed: int | None = None
    model: str | None = None
    code: str | None = None
    unsafe_no_sandbox: bool = False
    argv: tuple[str, ...] = ()  # a program's `-- PROGRAM ARG...`: another command line
    sealed: bool = False  # a program's --sealed: nothing runs live
    upstream: str | None = None  # against an imported trace: where live model calls go (--upstream URL)
    upstream_key_env: str | None = None

    def only_imported(self, run) -> None:
        if self.upstream is not None or self.upstream_key_env is not None:
            raise KindError(f"--upstream runs a program's live calls against an imported trace (tttr import), and run "
                            f"{run.id} is none: drop --upstream")


@dataclass(frozen=True, slots=True)
class RecordRequest:
    """What `tttr record` is asked for: the built-in agent on `task` (its sampling, kernel mode,
    steps and clock), or a user's program `argv` (its start `tree`, checker, time limit). `clock`
    None: the task's, or now; `seed` None: a fresh one."""

    task: str | None = None
    argv: tuple[str, ...] = ()
    model: str | None = None
    seed: int | None = None
    clock: Any = None  # a datetime the sandbox's clock can show
    unsafe_no_sandbox: bool = False
    temperature: float = 0.7
    top_p: float = 1.0
    top_k: int = 0
    kernels: str = "invariant"
    max_steps: int = 6
    tree: str | None = None
    check: str | None = None
    timeout_s: float = 600.0
    in_place: bool = False


@dataclass(frozen=True, slots=True)
class ForkRequest:
    site: str
    value: str
    model: str | None = None
    unsafe_no_sandbox: bool = False
    argv: tuple[str, ...] = ()  # `-- PROGRAM ARG...` and --code DIR: a program forked against an imported trace
    code: str | None = None
    upstream: str | None = None  # and where its live model calls go (--upstream URL)
    upstream_key_env: str | None = None
    # The engine.replay.runtime.Runtime a caller holds already (the app's, shared by its forks, its
    # model loaded once): the agent's and served calls' forks compute with it, a program's checks
    # a token with its tokenizer. None: one of `model`, in the run's kernel mode.
    runtime: Any = None

    def only_imported(self, run) -> None:
        if self.argv or self.code is not None or self.upstream is not None or self.upstream_key_env is not None:
            what = "-- PROGRAM" if self.argv else "--code" if self.code is not None else "--upstream"
            raise KindError(f"{what} forks your program against an imported trace (tttr import), and run {run.id} "
                            f"is none: drop {what}")


@dataclass(frozen=True, slots=True)
class Plan:
    """A checked verb, ready to act on: the run, the request, and what the kind's check
    built: for an agent run or served calls the decoded run, the parsed change, the child's
    settings and the runtime (runs.AgentPlan, calls.CallPlan: acting reads the run no more);
    a program's fork plan; an experiment's runtime or set-up; a recording's settings (no run
    yet: run_id None)."""

    run_id: int | None
    request: Any
    checked: Any = None


@dataclass(frozen=True, slots=True)
class ExperimentRequest:
    """Triage or bisect of two runs of one kind: GOOD passed, BAD failed by `judge`."""

    good: int
    bad: int
    judge: str = "outcome"
    model: str | None = None
    batch: bool = True
    max_replays: int = 50
    unsafe_no_sandbox: bool = False
    ray: str | None = None  # each replay a Ray task: at this cluster address, or a local instance (""); None: here
    runtime: Any = None  # a Runtime the caller holds (the app's): the agent's replays compute with it; None: of `model`


Progress = Callable[..., None]


class Compared(NamedTuple):
    """Two runs of one kind loaded for comparing (decoded once: the kind's pair, whose base
    the deltas apply to) and the values that differ between them (`RunKind.compare`)."""

    pair: Any  # engine/replay/deltas.py's Pair, engine/program/deltas.py's ProgramPair
    deltas: list


class RunKind:
    name = ""
    label = ""  # how a message names a run of this kind
    experiments = True  # triage and bisect take two runs of this kind
    # The event kinds a run of this kind has one step per (`tttr diff`'s rows, the compare
    # screen's): by default a run of model calls' (a message, an SDK tool's call, a clock read).
    step_kinds: tuple[str, ...] = _steps.PROGRAM_STEP_KINDS
    # Its replay and fork re-execute a user's program (engine/program/): they report in lines of
    # their own and return a program's result (ReplayResult, a RunResult with the program's fields).
    runs_program = False

    def steps(self, events: list) -> list[_steps.Step]:
        """The run's steps, in order, from its events (decoded; a caller that could not read
        some passes what it has): what `tttr diff` and the compare screen align."""
        return _steps.program_steps(events)

    def deltas(self, reader, base: int, other: int) -> list:
        """The values that differ between runs `base` and `other` of this kind (engine/replay/
        deltas.py's Delta: each applies `other`'s value to `base`), read-only; DeltaError (one
        line) for a pair that cannot be compared or does not differ, KindError for a kind that
        has no deltas."""
        return self.compare(reader, base, other).deltas

    def compare(self, reader, base: int, other: int) -> Compared:
        """`deltas`, with the pair they were found in (what an experiment's check goes on to
        replay, so the runs are decoded once)."""
        raise KindError(f"run {other} is {self.label}: deltas are found between two of the shell agent's runs "
                        "(tttr record --task) or two runs of one recorded program (tttr record -- PROGRAM)")

    def check_record(self, request: RecordRequest) -> Plan:
        """Everything a new recording needs, checked before the database is touched (one line,
        exit 2, when it cannot run); `record` acts on the plan."""
        raise KindError(f"tttr record does not make {self.label}: it takes --task NAME (the shell agent) or "
                        "-- PROGRAM ARG... (your program)")

    def record(self, db: str, plan: Plan, progress: Progress | None = None) -> RunResult:
        raise NotImplementedError

    def check_replay(self, reader, run, request: ReplayRequest) -> Plan:
        raise NotImplementedError

    def replay(self, db: str, plan: Plan, progress: Progress | None = None) -> RunResult:
        raise NotImplementedError

    def check_fork(self, reader, run, request: ForkRequest) -> Plan:
        raise NotImplementedError

    def check_value(self, reader, run, site: str, value: str, runtime) -> None:
        """An edit dialog's check of one new value at `site` of `run`, on each confirm: read-only
        and cheap (the value parsed as the fork parses it; the whole fork is checked when it
        starts); raises the one line (a TTTRError or ValueError) when it is no value there.
        `runtime`: the caller's (its tokenizer reads a token's value)."""
        from tttr.engine.replay.mutation import parse_mutation

        tokenizer = None
        if ":token:" in site:
            if runtime.model_id != run.model_id:
                raise KindError(f"run #{run.id} was recorded with model {run.model_id}, which is not the model at hand: "
                                "start the app with --model pointing at it (or set TTTR_MODEL)")
            tokenizer = runtime.tokenizer
        parse_mutation(reader, run.id, site, value, tokenizer=tokenizer)

    def edit_offer(self, event):
        """What an edit dialog offers at `event` of a run of this kind (engine/program/edit.py's
        EditOffer), or why nothing can be edited there (a line); None where the agent's dialog
        (a clock reading, a tool result, a token, the setup values) applies as it is."""
        return None

    def fork(self, db: str, plan: Plan, progress: Progress | None = None, *, cancel=None,
             steps=None) -> RunResult:
        """Act on a checked fork. `cancel` (a threading.Event): once set, the child stops early
        and is stored incomplete. `progress` reports as the kind does (runs_program: lines of
        text; else (done, total, text) per step); `steps`, (done, total, text) per step, is for
        a kind whose `progress` is lines (a program's fork, step by step of the recording)."""
        raise NotImplementedError

    def check_experiment(self, reader, db: str, verb: str, request: ExperimentRequest) -> Plan:
        """`verb` ("triage" or "bisect") checked read-only: the pair, its deltas, GOOD's faithful
        replay and BAD's failure; one line and nothing written when it cannot run."""
        raise self.refuse_experiment(reader.run(request.bad), verb)

    def refuse_experiment(self, run, verb: str) -> TTTRError:
        """Why `verb` does not take `run`, a run of this kind (one line)."""
        return KindError(f"run {run.id} is {self.label}: {verb} works on the shell agent's runs "
                         "(tttr record --task) and recorded programs (tttr record -- PROGRAM)")

    def triage(self, db: str, plan: Plan, on_layer=None, *, cancel=None):
        """Act on a checked triage; `cancel` (a threading.Event), once set, stops the replays in
        flight at their next step and starts no other layer."""
        raise NotImplementedError

    def bisect(self, db: str, plan: Plan, on_round=None, on_trial=None, *, cancel=None):
        """Act on a checked bisect; `cancel` as for triage (ddmin ends with the best set so far)."""
        raise NotImplementedError


def ray_tests(address: str | None):
    """An experiment's `--ray [ADDRESS]` as what triage and bisect take: a factory of the Ray
    tests of a database (engine/replay/ray_experiments.py), or None to replay here. Made here,
    above the experiments, so they never import the Ray module that runs their own tests."""
    if address is None:
        return None
    from tttr.engine.replay.ray_experiments import RayTests

    return lambda db: RayTests(db, address or None)


class AgentRuns(RunKind):
    """The built-in shell agent on a task: the oracle's replay (engine/replay/runs.py)."""

    name, label = "agent", "the built-in agent's run"
    step_kinds = _steps.ACTION_STEP_KINDS

    def steps(self, events: list) -> list[_steps.Step]:
        return _steps.action_steps(events)

    def compare(self, reader, base: int, other: int) -> Compared:
        from tttr.engine.replay.deltas import Pair, differing

        pair = Pair.load(reader, base, other)
        return Compared(pair, differing(pair))

    def kernel_mode(self, run) -> str:
        return run.kernel_mode

    def runtime(self, run, model: str | None):
        """The runtime a replay or fork of `run` computes with, in the kernel mode it names."""
        from tttr.engine.replay.runtime import Runtime

        return Runtime(model, kernel_mode=self.kernel_mode(run) or "invariant")

    def check_record(self, request: RecordRequest) -> Plan:
        from datetime import datetime

        from tttr.engine.inference.sampler import SamplingParams
        from tttr.engine.replay.agent import AgentLimits
        from tttr.engine.replay.runs import check_machine, sandbox_clock
        from tttr.engine.replay.runtime import Runtime
        from tttr.recorders.tasks import load_task

        limits = AgentLimits(max_steps=request.max_steps)
        SamplingParams(temperature=request.temperature, top_p=request.top_p, top_k=request.top_k,
                       seed=request.seed or 0)
        task = load_task(request.task)  # an unknown task fails before the database is touched
        runtime = Runtime(request.model, kernel_mode=request.kernels or "invariant")
        sandbox_clock(request.clock or getattr(task, "clock", None) or datetime.now(), f"task {request.task}'s clock")
        check_machine(runtime, request.unsafe_no_sandbox)
        return Plan(None, request, (runtime, limits))  # no run yet

    def record(self, db: str, plan: Plan, progress: Progress | None = None):
        from tttr.engine.replay.runs import record
        from tttr.sessions.store import Store

        r, (runtime, limits) = plan.request, plan.checked
        with Store.open(db, create=True) as store:
            return record(store, r.task, runtime=runtime, seed=r.seed, temperature=r.temperature, top_p=r.top_p,
                          top_k=r.top_k, clock=r.clock, limits=limits, unsafe_no_sandbox=r.unsafe_no_sandbox,
                          progress=progress)

    def check_replay(self, reader, run, request: ReplayRequest) -> Plan:
        from tttr.engine.replay.policy import PolicyError

        request.only_imported(run)
        if request.code is not None:
            raise KindError(f"--code lays a program's files over its start tree, and run {run.id} is no recorded "
                            "program (tttr record -- PROGRAM): drop --code")
        if request.argv or request.sealed:
            what = "--sealed" if request.sealed else "-- PROGRAM"
            raise KindError(f"{what} replays a recorded program against today's code, and run {run.id} is no recorded "
                            f"program (tttr record -- PROGRAM): drop {what}")
        if request.seed is not None and request.policy.pinned("token"):
            raise PolicyError("--seed seeds a freed token layer, and this replay pins it (the recorded tokens): "
                              "add --free token, or drop --seed")
        # Checked on a read-only connection: a run that cannot be replayed (a value of the wrong
        # shape, a clock the sandbox cannot show, another model) is refused with the file untouched.
        # The plan holds what the check decoded: acting on it reads nothing of the run again.
        return Plan(run.id, request, self._check_replay(reader, run, request, self.runtime(run, request.model)))

    def _check_replay(self, reader, run, request: ReplayRequest, runtime):
        from tttr.engine.replay.runs import check_replay

        return check_replay(reader, run.id, request.policy, runtime=runtime, seed=request.seed,
                            unsafe_no_sandbox=request.unsafe_no_sandbox)

    def replay(self, db: str, plan: Plan, progress: Progress | None = None):
        return self._act(db, plan, progress)

    def check_fork(self, reader, run, request: ForkRequest) -> Plan:
        # The run, the site and the new value are all checked (the value parsed) before the file
        # is opened for writing: a refused fork writes nothing and prints no progress.
        request.only_imported(run)
        runtime = request.runtime or self.runtime(run, request.model)
        return Plan(run.id, request, self._check_fork(reader, run, request, runtime))

    def _check_fork(self, reader, run, request: ForkRequest, runtime):
        from tttr.engine.replay.runs import check_fork

        return check_fork(reader, run.id, request.site, request.value, runtime=runtime,
                          unsafe_no_sandbox=request.unsafe_no_sandbox)

    def fork(self, db: str, plan: Plan, progress: Progress | None = None, *, cancel=None, steps=None):
        return self._act(db, plan, progress, cancel)  # progress is step by step already

    def _act(self, db: str, plan: Plan, progress: Progress | None, cancel=None):
        """The one open for writing; the checked plan (runs.AgentPlan, calls.CallPlan) acts on it,
        refusing in one line a run deleted or replaced since the check."""
        from tttr.sessions.store import Store

        with Store.open(db, create=False) as store:
            return plan.checked.act(store, progress=progress, cancel=cancel)

    def check_experiment(self, reader, db: str, verb: str, request: ExperimentRequest) -> Plan:
        from tttr.engine.replay import bisect, triage

        prepare = triage.prepare if verb == "triage" else bisect.prepare
        bad = reader.run(request.bad)
        runtime = request.runtime or self.runtime(bad, request.model)
        # triage replays BAD with GOOD's values, bisect GOOD with BAD's: the base run first
        base, other = (request.bad, request.good) if verb == "triage" else (request.good, request.bad)
        prepared = prepare(reader, request.good, request.bad, request.judge, runtime=runtime,
                           unsafe_no_sandbox=request.unsafe_no_sandbox, compared=self.compare(reader, base, other))
        return Plan(request.bad, request, (runtime, prepared))  # acting replays GOOD no second time

    def triage(self, db: str, plan: Plan, on_layer=None, *, cancel=None):
        from tttr.engine.replay.triage import triage
        from tttr.sessions.store import Store

        r, (runtime, prepared) = plan.request, plan.checked
        with Store.open(db, create=False) as store:
            return triage(store, r.good, r.bad, judge=r.judge, runtime=runtime, batch=r.batch,
                          unsafe_no_sandbox=r.unsafe_no_sandbox, on_layer=on_layer, cancel=cancel,
                          ray=ray_tests(r.ray), prepared=prepared)

    def bisect(self, db: str, plan: Plan, on_round=None, on_trial=None, *, cancel=None):
        from tttr.engine.replay.bisect import bisect
        from tttr.sessions.store import Store

        r, (runtime, prepared) = plan.request, plan.checked
        with Store.open(db, create=False) as store:
            return bisect(store, r.good, r.bad, judge=r.judge, max_replays=r.max_replays, runtime=runtime,
                          batch=r.batch, unsafe_no_sandbox=r.unsafe_no_sandbox, on_round=on_round, on_trial=on_trial,
                          cancel=cancel, ray=ray_tests(r.ray), prepared=prepared)


class ServedCalls(AgentRuns):
    """Calls recorded by `tttr serve --db`: replayed and forked call by call (engine/replay/calls.py's
    check_call_replay / check_call_fork, acted on as the agent's plans are); no experiments yet."""

    name, label, experiments = "calls", "a served API's calls", False
    step_kinds, steps, compare = RunKind.step_kinds, RunKind.steps, RunKind.compare  # one step per call; no deltas yet
    check_record = RunKind.check_record  # recorded by tttr serve --db, as its calls come

    def kernel_mode(self, run) -> str:
        from tttr.engine.replay.calls import local_kernel_mode

        return local_kernel_mode(run)  # a proxied run's calls, if ever generated here, in the local default

    def _check_replay(self, reader, run, request: ReplayRequest, runtime):
        from tttr.engine.replay.calls import check_call_replay
        from tttr.engine.replay.source import Source

        return check_call_replay(Source(reader, run.id), request.policy, runtime=runtime, seed=request.seed)

    def _check_fork(self, reader, run, request: ForkRequest, runtime):
        from tttr.engine.replay.calls import check_call_fork
        from tttr.engine.replay.source import Source

        return check_call_fork(Source(reader, run.id), request.site, request.value, runtime=runtime)

    check_experiment = RunKind.check_experiment  # refused: no deltas of calls yet


class RecordedProgram(RunKind):
    """A user's program run in the sandbox (engine/program/)."""

    name, label, runs_program = "program", "a recorded program's run", True

    def check_record(self, request: RecordRequest) -> Plan:
        import random
        from datetime import datetime

        from tttr.engine.replay.runs import sandbox_clock

        clock = request.clock if request.clock is not None else sandbox_clock(datetime.now(), "--clock")
        seed = request.seed if request.seed is not None else random.randrange(2**31)
        if request.in_place and request.tree is None:
            raise KindError("--in-place runs the program in --tree DIR itself: give --tree DIR, or drop --in-place")
        return Plan(None, request, (clock, seed))  # no run yet

    def record(self, db: str, plan: Plan, progress: Progress | None = None):
        from tttr.engine.program.record import record_program

        r, (clock, seed) = plan.request, plan.checked
        return record_program(db, list(r.argv), tree=r.tree, clock=clock, seed=seed, model=r.model, check=r.check,
                              timeout_s=r.timeout_s, unsafe_no_sandbox=r.unsafe_no_sandbox, progress=progress,
                              in_place=r.in_place)

    def compare(self, reader, base: int, other: int) -> Compared:
        from tttr.engine.program.deltas import ProgramPair, differing

        pair = ProgramPair.load(reader, base, other)
        return Compared(pair, differing(pair))

    def check_replay(self, reader, run, request: ReplayRequest) -> Plan:
        from tttr.engine.program.replay import check_recording

        request.only_imported(run)
        if not request.policy.faithful or request.seed is not None:
            raise KindError(f"run {run.id} is a recorded program: only its faithful replay is supported yet "
                            "(drop --free and --seed)")
        # The recording decoded and checked once (engine/program/replay.py's Recording): the replay acts on it.
        return Plan(run.id, request, check_recording(reader, run.id, sealed=request.sealed, code=request.code,
                                                     argv=list(request.argv) or None))

    def replay(self, db: str, plan: Plan, progress: Progress | None = None):
        from tttr.engine.program.replay import replay_program

        r = plan.request
        return replay_program(db, plan.run_id, unsafe_no_sandbox=r.unsafe_no_sandbox, progress=progress,
                              model=r.model, code=r.code, argv=list(r.argv) or None, sealed=r.sealed,
                              recording=plan.checked)  # model: for calls after a divergence, generated live

    def check_fork(self, reader, run, request: ForkRequest) -> Plan:
        from tttr.engine.program.fork import check_program_fork

        request.only_imported(run)
        model = request.model if request.model is not None or request.runtime is None else str(request.runtime.path)
        return Plan(run.id, request, check_program_fork(reader, run.id, request.site, request.value,
                                                        model=model, runtime=request.runtime))

    def edit_offer(self, event):
        from tttr.engine.program.edit import offer

        return offer(event)

    def check_value(self, reader, run, site: str, value: str, runtime) -> None:
        from tttr.engine.program.fork import check_program_fork
        from tttr.sessions.vocabulary import Site

        # The fork's own check: the recording is small; a token or an answer asks the model's tokenizer
        computes = Site.parse(site).name in ("token", "message")
        check_program_fork(reader, run.id, site, value, model=str(runtime.path), runtime=runtime if computes else None)

    def fork(self, db: str, plan: Plan, progress: Progress | None = None, *, cancel=None, steps=None):
        from dataclasses import replace

        from tttr.engine.program.replay import replay_program

        # Cancelled, the program's next model call is refused: it ends early, stored incomplete.
        fork = (plan.checked if steps is None and cancel is None
                else replace(plan.checked, progress=steps, cancel=cancel))
        return replay_program(db, plan.run_id, unsafe_no_sandbox=plan.request.unsafe_no_sandbox,
                              progress=progress, fork=fork)

    def check_experiment(self, reader, db: str, verb: str, request: ExperimentRequest) -> Plan:
        from tttr.engine.program.triage import prepare

        # triage replays BAD with GOOD's values, bisect GOOD with BAD's: the base run first
        base, other = (request.bad, request.good) if verb == "triage" else (request.good, request.bad)
        return Plan(request.bad, request, prepare(db, base, other, request.good, request.judge, model=request.model,
                                                  unsafe_no_sandbox=request.unsafe_no_sandbox,
                                                  compared=self.compare(reader, base, other)))

    def triage(self, db: str, plan: Plan, on_layer=None, *, cancel=None):
        from tttr.engine.program.triage import triage

        r = plan.request
        return triage(db, r.good, r.bad, judge=r.judge, model=r.model, batch=r.batch,
                      unsafe_no_sandbox=r.unsafe_no_sandbox, on_layer=on_layer, cancel=cancel, setup=plan.checked,
                      ray=ray_tests(r.ray))

    def bisect(self, db: str, plan: Plan, on_round=None, on_trial=None, *, cancel=None):
        from tttr.engine.program.triage import bisect

        r = plan.request
        return bisect(db, r.good, r.bad, judge=r.judge, max_replays=r.max_replays, model=r.model, batch=r.batch,
                      unsafe_no_sandbox=r.unsafe_no_sandbox, on_round=on_round, on_trial=on_trial, cancel=cancel,
                      setup=plan.checked, ray=ray_tests(r.ray))


class ImportedTrace(RunKind):
    """A trace imported from an OpenTelemetry export (engine/traces/): its messages and tool
    results, no program, clock, randomness, trees or tokens. Replay and fork run a user's
    program against it (engine/traces/against.py); experiments refuse it."""

    name, label, experiments = "imported", "an imported trace", False
    runs_program = True  # its replay and fork run a program against the trace (engine/traces/against.py)

    def check_replay(self, reader, run, request: ReplayRequest) -> Plan:
        from tttr.engine.traces.kind import check_replay

        return Plan(run.id, request, check_replay(reader, run, request))

    def replay(self, db: str, plan: Plan, progress: Progress | None = None):
        from tttr.engine.traces.kind import act

        return act(db, plan, progress)

    def check_fork(self, reader, run, request: ForkRequest) -> Plan:
        from tttr.engine.traces.kind import check_fork

        return Plan(run.id, request, check_fork(reader, run, request))

    def fork(self, db: str, plan: Plan, progress: Progress | None = None, *, cancel=None, steps=None):
        """A replay against the trace with one value changed (the plan holds it); no step counts."""
        from dataclasses import replace

        from tttr.engine.traces.kind import act

        return act(db, plan if cancel is None else replace(plan, checked=replace(plan.checked, cancel=cancel)), progress)

    def refuse_experiment(self, run, verb: str) -> TTTRError:
        from tttr.engine.traces.kind import check_experiment

        try:
            check_experiment(run, verb)
        except TTTRError as refused:
            return refused
        return super().refuse_experiment(run, verb)


AGENT, CALLS, PROGRAM, IMPORTED = AgentRuns(), ServedCalls(), RecordedProgram(), ImportedTrace()
KINDS = (AGENT, CALLS, PROGRAM, IMPORTED)


def pair_kind(good, bad, verb: str) -> RunKind:
    """The kind an experiment over runs `good` and `bad` runs as: both of one kind, and one
    experiments take (KindError naming the odd one out, or the kind that has none)."""
    kinds = kind_of(good), kind_of(bad)
    for run, kind in ((good, kinds[0]), (bad, kinds[1])):
        if kind is PROGRAM and kinds[0] is not kinds[1]:
            other = bad if run is good else good
            raise KindError(f"run {run.id} is a recorded program, but run {other.id} is not: give two runs of the "
                            "same program (tttr record -- PROGRAM)")
        if not kind.experiments:
            raise kind.refuse_experiment(run, verb)
    return kinds[0]


def kind_of(run) -> RunKind:
    """The kind of `run` (a sessions Run): what recorded it, as its metadata says (`RunMeta.kind`)."""
    return {"agent": AGENT, "calls": CALLS, "program": PROGRAM, "imported": IMPORTED}[run.meta.kind]
