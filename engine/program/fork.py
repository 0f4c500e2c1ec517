"""`tttr fork RUN --at SITE --set VALUE` of a recorded program (see engine/program/replay.py).

The program runs again as in a faithful replay: every step before the fork site is answered
from the recording. At the site:

- `STEP:tool` (an SDK tool call): the tool is not run; the SDK gets the new value. For a
  function (`@sdk.tool`) a JSON object with `result` and/or `error` sets those, other JSON
  (`3`, `"text"`, `[1, 2]`) is the new result, and plain text is the new result as a string;
  for a command (`sdk.shell`) the grammar is the built-in agent's (stdout text, `exit=N`,
  JSON with stdout/stderr/exit_code).
- `STEP:clock` (an `sdk.now()` read): the program reads the new value (the clock grammar:
  an ISO date-time or a shift like `+90`, `-2h`, `+1d`), and every later read of the run's
  clock is moved by the same amount. The setup clock (`setup:clock`) moves the whole run: the
  program runs again with its virtual clock (faketime and `sdk.now()`) started at the new time.
- `STEP:clock` of a model call (the program's own clock before call STEP): the offset of the
  new value is written into the program's clock file before the step before it is answered, so
  every realtime read of the program from there on (`datetime.now()`, `date`) is moved by it;
  the monotonic clock, sleeps and timeouts are not.
- `STEP:token:POS` (a model call): the call is generated again from its recorded prompt
  with its own sampling and seed (engine/replay/calls.py's checks), its tokens before POS
  forced to the recorded ones, the new token at POS, the rest sampled live. The model loads
  in the background from the fork's start, while the program runs up to the site.

After the site, requests that still equal the recording are answered from it; the first one
that differs is the divergence, and from there on model calls are generated live
(engine/program/live.py) and SDK tools run live. The child run records its parent, fork site and
mutation; when the recording was made with --check, the check runs again on the fork's end tree.

A plan may hold several changes at once (`ForkPlan.changes`): triage and bisect apply a set of
deltas between two recordings that way (engine/program/triage.py), each change at its own site,
and a changed seed for the run's sandbox."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from tttr.engine.program.record import ProgramRunError
from tttr.engine.replay.mutation import Mutation
from tttr.engine.program.replay import (
    Recording, Replayer, _Step, load_recording, recorded_clock, recorded_clock_read,
)
from tttr.engine.serve.errors import APIError
from tttr.sessions.vocabulary import SETUP_STEP, SETUP_VALUES, Site, SiteError, canonical_site, site, site_parts

SITES = ("an SDK tool (STEP:tool), a clock read (STEP:clock, or setup:clock), a model call's token (STEP:token:POS) "
         "or its whole answer (STEP:message), a file of the start tree (setup:file:PATH) or a variable it starts "
         "with (setup:env:NAME)")


@dataclass(frozen=True, slots=True)
class Change(Mutation):
    """One new value at one site of a program run, a fork's or one of an experiment's: the
    Mutation every kind's fork carries (site, value, text: as given, or what the value is for an
    experiment's delta), with what a program's replay needs to apply it. Its value: tool, a dict
    of replaced fields; token, an int token id; clock, the new ISO time; setup:file, {"path",
    "text"}; setup:env, {"name", "value"}."""

    forced: dict | None = None  # token: {position: token id}
    settings: dict | None = None  # token: prompt ids, seed, max_tokens
    shift: timedelta = timedelta(0)  # clock: how far the new value moves the read (or the run's start)
    # An experiment's change applies where its request comes again after a divergence, too:
    # a tool's (function, args, kwargs or cmd, cwd, timeout_s), a model call's request body.
    request: dict | None = None

    @property
    def at_setup(self) -> bool:
        return self.site.step == SETUP_STEP

    @property
    def key(self) -> tuple[int, str]:
        return self.site.step, self.site.name


@dataclass(slots=True)
class ForkPlan:
    """A checked fork: its changes (one for `tttr fork`; several for an experiment's replay,
    engine/program/triage.py), and how the child run is written.

    `strict` (a user's fork): a clock read's new value moves every later read by as much.
    Not strict (an experiment, each differing read a change of its own): a change replaces
    its own value only, and applies where its step comes as recorded or, after the
    divergence, where its request (`Change.request`) comes again."""

    run_id: int
    changes: tuple[Change, ...]
    fork_seq: int  # the first change's seq in the parent: the events before it are shared
    model: str | None = None
    shared: frozenset = frozenset()  # the first change's step's events before it: the parent's, shared
    strict: bool = True
    seed: int | None = None  # another seed for the run (its sandbox's randomness): written from the start
    check: str | None = None  # the recorded --check, run on the end tree
    meta: dict | None = None  # the child run's meta
    mutation: dict | None = None  # the child run's mutation column (default: the one change's)
    live: object = None  # an experiment's model (engine/program/triage.py's SharedModel): each test binds its own view
    # From the app's worker: progress(done, total, text) after each step, and an Event that,
    # once set, refuses the program's next model calls so that it ends early.
    progress: object = None
    cancel: object = None
    # The recording as the check decoded it (check_program_fork): acting on the plan decodes
    # nothing again. None (an experiment's plan): the replay reads it itself.
    recording: Recording | None = None

    def __post_init__(self) -> None:
        keys = [c.key for c in self.changes]
        if len(set(keys)) != len(keys):
            raise ProgramRunError("two changes of one site: give one value per site")

    # The one change of a user's fork (the first of an experiment's).
    @property
    def first(self) -> Change | None:
        return self.changes[0] if self.changes else None

    @property
    def site(self) -> Site | None:
        return self.first.site if self.first else None

    @property
    def value(self):
        return self.first.value if self.first else None

    @property
    def text(self) -> str:
        return self.first.text if self.first else ""

    @property
    def setup_change(self) -> Change | None:
        """The change of the setup clock, if any."""
        return next((c for c in self.changes if c.at_setup and c.site.name == "clock"), None)

    @property
    def at_setup(self) -> bool:
        """Written from the start (nothing shared): a setup value changes (the clock, a file of
        the start tree, a variable), or the seed."""
        return any(c.at_setup for c in self.changes) or self.seed is not None or not self.changes

    def run_seed(self, recorded: int | None) -> int | None:
        return recorded if self.seed is None else self.seed

    def columns(self) -> dict:
        fork_site = str(self.site) if any(c.at_setup for c in self.changes) or not self.at_setup else None
        mutation = self.mutation or (self.changes[0].to_json() if self.changes else None)  # as every kind's
        out = {"fork_seq": self.fork_seq, "fork_site": fork_site, "mutation": mutation}
        meta = {**(self.meta or {}), **({"check": self.check} if self.check else {})}
        return out | ({"meta": meta} if meta else {})

    def start_clock(self, recorded: datetime) -> datetime:
        """The virtual clock the program starts at: moved by a change of the setup clock."""
        change = self.setup_change
        return recorded + change.shift if change is not None else recorded

    def adopt(self, recorder, child: int, setup: dict, setup_clock: dict | None = None) -> None:
        """Make run `child` the fork's: the parent's events before the first change are
        shared; a run written from the start shares nothing and begins with the setup (at
        the new time, if the setup clock changed)."""
        if self.at_setup:
            change = self.setup_change
            clock = {"t": change.value} if change is not None else setup_clock
            recorder.adopt(recorder.default_run, child)
            if clock is not None:
                recorder.store.append(child, site(SETUP_STEP, "clock"),
                                      clock)
            new_setup = {**setup, "clock": change.value} if change is not None else setup
            recorder.store.append(child, site(SETUP_STEP, "setup"),
                                  new_setup)
            recorder.store.commit_step(child)
            return
        recorder.adopt(recorder.default_run, child, first_step=self.site.step)
        recorder.shared.update(self.shared)

    def lay_setup(self, setup: dict, tree_dir, store) -> dict:
        """The setup the child starts with: the recorded one with this fork's new start-tree
        files written into `tree_dir` (the tree the program runs from) and its variables
        (engine/program/setup_values.py)."""
        from tttr.engine.program import setup_values

        return setup_values.lay([c for c in self.changes if c.at_setup], setup, tree_dir, store)

    def replayer(self, rec, recorder, name: str) -> "ForkReplayer":
        return ForkReplayer(rec, recorder, name, self)


def _sdk_value(text: str, recorded: dict) -> dict:
    """The new value of an SDK tool step: see the module's text."""
    if "function" not in recorded:  # sdk.shell: the built-in agent's tool grammar
        from tttr.engine.replay.mutation import tool_value

        return tool_value(text)
    stripped = text.strip()
    if re.fullmatch(r"exit(?:_code)?\s*=\s*-?\d+", stripped):
        raise ProgramRunError(f"the tool is the function {recorded['function']!r}, which has no exit code: set its "
                              "result (JSON or text) or {\"error\": \"...\"}")
    try:
        value = json.loads(stripped)
    except ValueError:
        return {"result": text}
    if isinstance(value, dict) and value and set(value) <= {"result", "error"}:
        if "error" in value:  # one grammar: text, or {"type", "message"}, stored as the SDK records one
            value = {**value, "error": _tool_error(value["error"])}
        return value
    return {"result": value}


def _tool_error(error) -> dict:
    """An SDK tool's new error as the SDK records one, {"type", "message"}: from text
    ("disk offline": an Exception with that message) or an object naming at least its message."""
    if isinstance(error, str):
        return {"type": "Exception", "message": error}
    if isinstance(error, dict) and isinstance(error.get("message"), str) \
            and isinstance(error.get("type", "Exception"), str) and set(error) <= {"type", "message"}:
        return {"type": error.get("type", "Exception"), "message": error["message"]}
    raise ProgramRunError(f"an SDK tool's error is text or {{\"type\": ..., \"message\": ...}}, not {error!r}")


def check_program_fork(store, run_id: int, site_text: str, value_text: str, *, model: str | None = None,
                       runtime=None) -> ForkPlan:
    """Everything a program fork checks before it writes; ProgramRunError (one line) if bad.
    `runtime` (engine.replay.runtime.Runtime of `model`): the model's identity and tokenizer
    for a token's value, when the caller holds one already (the app)."""
    rec = load_recording(store, run_id)  # the run decoded once: the plan keeps it
    try:
        at = Site.parse(site_text)
    except (SiteError, ValueError) as exc:
        raise ProgramRunError(f"{exc}; a program run forks at {SITES}") from None
    step = next((s for s in rec.steps if s.step == at.step), None)
    source = rec.source
    if at.name == "clock":
        return _check_clock(rec, source, at, step, value_text)
    if at.name == "tool":
        if step is None or step.kind != "tool":
            raise ProgramRunError(f"site {at} is not an SDK tool call of run {run_id}: "
                                  f"`tttr events DB {run_id}` lists its sites")
        recorded = next(e.value for e in step.events if e.kind == "tool")
        try:
            value = _sdk_value(value_text, recorded)
        except ValueError as exc:
            raise ProgramRunError(str(exc)) from None
        return ForkPlan(run_id, (Change(at, value, value_text),), source.seq_of(str(at)), shared=shared_before(source, at),
                        check=recorded_check(store, rec.run), recording=rec)
    if at.name in SETUP_VALUES:
        from tttr.engine.program.setup_values import check

        value = check(store, run_id, str(at), value_text)
        return ForkPlan(run_id, (Change(at, value, value_text),), 0, check=recorded_check(store, rec.run),
                        recording=rec)
    if at.name in ("token", "message"):
        if step is None or step.kind != "call":
            raise ProgramRunError(f"site {at} is not a model call's {'token' if at.name == 'token' else 'answer'} "
                                  f"in run {run_id}: `tttr events DB {run_id}` lists its sites")
        return _check_token(store, rec, at, value_text, model, runtime)
    raise ProgramRunError(f"a program run forks at {SITES}, not {at}")


def _check_clock(rec, source, at: Site, step, value_text: str) -> ForkPlan:
    """A clock read's (or the setup clock's) new value, and how far it moves the run's clock."""
    from tttr.engine.replay.mutation import MutationError, clock_value

    program_read = step is not None and recorded_clock_read(step) is not None  # the program's own, before a call
    if at.step == SETUP_STEP:
        recorded = rec.setup.get("clock") or rec.run.meta.clock
        fork_seq, shared = 0, frozenset()
    elif step is None or (step.kind != "clock" and not program_read):
        raise ProgramRunError(f"site {at} is not a clock read (sdk.now(), or the program's clock before a model "
                              f"call) of run {rec.run.id}: `tttr events DB {rec.run.id}` lists its sites")
    else:
        recorded = next(e.value for e in step.events if e.kind == "clock").get("t")
        fork_seq, shared = source.seq_of(str(at)), shared_before(source, at)
    try:
        old = datetime.fromisoformat(recorded)
        new = _utc(clock_value(value_text, {"t": recorded}))
    except (MutationError, TypeError, ValueError) as exc:
        raise ProgramRunError(f"run {rec.run.id}, site {at}: {exc}") from None
    # a read the program made moves by exactly the shift (to the µs it was read at); an SDK
    # read or the setup clock, to the second
    shift = (new if program_read else new.replace(microsecond=0)) - _utc(old)
    return ForkPlan(rec.run.id, (Change(at, (old + shift).isoformat(), value_text, shift=shift),), fork_seq,
                    shared=shared, check=recorded_check(source.store, rec.run), recording=rec)


def _utc(t: datetime) -> datetime:
    """`t` as a naive UTC time (the virtual clock's), whether or not it carries a zone."""
    return t if t.tzinfo is None else t.astimezone(timezone.utc).replace(tzinfo=None)


def _check_token(store, rec: Recording, at: Site, value_text: str, model: str | None, runtime=None) -> ForkPlan:
    from tttr.engine.replay.calls import call_settings, recorded_seed
    from tttr.engine.replay.mutation import parse_mutation
    from tttr.engine.replay.runtime import Runtime

    source, run = rec.source, rec.run
    runtime = runtime or Runtime(model)  # the model's identity and tokenizer only: nothing loads here
    if run.model_id != runtime.model_id:
        raise ProgramRunError(f"run {run.id} was served by model {run.model_id}; generating its calls needs that "
                              f"model here, but the local model is {runtime.model_id}: pass it with --model")
    mutation = parse_mutation(store, run.id, str(at), value_text, tokenizer=runtime.tokenizer)
    prompt, sampling, max_tokens, _ = call_settings(source, at.step)
    seed = recorded_seed(source, sampling)
    if at.name == "message":  # the whole answer: every position forced, ended by the end of turn
        ids = list(runtime.tokenizer.encode(mutation.value)) + list(runtime.tokenizer.stop_token_ids[:1])
        forced = dict(enumerate(ids))
        settings = {"ids": list(prompt["ids"]), "seed": seed, "max_tokens": max(max_tokens, len(ids))}
        return ForkPlan(run.id, (Change(at, mutation.value, value_text, forced, settings),),
                        source.seq_of(mutation.first_site), model, shared_before(source, mutation.first_site),
                        check=recorded_check(store, run), recording=rec)
    before = source.tokens.get(at.step, [])[:at.pos]
    if not all(type(t.get("id")) is int for t in before):
        raise ProgramRunError(f"run {run.id}, call {at.step}: its tokens before position {at.pos} have no ids")
    forced = {p: t["id"] for p, t in enumerate(before)}
    forced[at.pos] = mutation.value
    settings = {"ids": list(prompt["ids"]), "seed": seed, "max_tokens": max_tokens}
    return ForkPlan(run.id, (Change(at, mutation.value, value_text, forced, settings),), source.seq_of(str(at)), model,
                    shared_before(source, at), check=recorded_check(store, run), recording=rec)


def shared_before(source, at) -> frozenset:
    """The events of `at`'s step before it (a Site, or a site's text): the parent's, shared."""
    seq = source.seq_of(str(at))
    step = source.by_site[canonical_site(str(at))].step
    return frozenset(e.site for e in source.events if e.step == step and e.seq < seq)


class ForkReplayer(Replayer):
    """A replay that takes the plan's new values at their sites and runs live after the divergence."""

    def __init__(self, rec, recorder, name: str, plan: ForkPlan):
        from tttr.engine.program.record import running_clock

        super().__init__(rec, recorder, name, plan.model)
        self.plan = plan
        if plan.live is not None:  # the model stays loaded from one test of an experiment to the next
            self.live = plan.live.bind(recorder)
        self.pending = {c.key: c for c in plan.changes if not c.at_setup}
        # setup:file changes: kept in the tree through the recorded effects of SDK functions
        self.start_files = {c.value["path"]: c.value["text"] for c in plan.changes if c.at_setup and c.site.name == "file"}
        self.applied: list[str] = [str(c.site) for c in plan.changes if c.at_setup]
        self.forked = plan.at_setup  # the setup comes before every request
        self.moved = timedelta(0)  # a strict fork's clock change moves the later reads by as much
        self.read_shift = timedelta(0)  # a change of the program's clock before a call: the offset its later reads get
        if plan.strict and plan.setup_change is not None:
            self.moved = plan.setup_change.shift
        if any(c.site.name in ("token", "message") for c in plan.changes):  # the model is needed: it loads meanwhile
            self.live.start_loading()
        self._live_clock = running_clock(recorded_clock(rec))  # as the server's, for live reads after the site

    def _copy(self, step: _Step) -> None:
        if self.forked or self.divergence is not None:
            super()._copy(step)
        else:  # before the first change: the parent's events are the child's, shared, not written again
            if self.clock is not None and step.kind == "call":
                self.clock.event()  # taken: the next call's read is its own
            self.cursor += 1
            self.answered += 1
            self.arm_clock()

    # -- the program's clock before a call (S:clock of a call step) -------------------------
    def _clock_at(self, step: _Step, index: int) -> None:
        change = self._change_at(step, "clock") if step.kind == "call" else None
        if change is None:
            return super()._clock_at(step, index)
        self._take_change(change)  # read moved already: the offset was set before the program got here
        if self.plan.strict:
            self.moved = self.read_shift = change.shift

    def expected_clock(self, step: _Step) -> str | None:
        """The recorded read moved as this fork moves the program's clock: by a changed
        setup clock, or from a changed read before a call on."""
        t = super().expected_clock(step)
        setup = self.plan.setup_change.shift if self.plan.setup_change is not None else timedelta(0)  # start_clock's
        moved = setup + self.read_shift
        if t is None or not moved:
            return t
        try:
            return (datetime.fromisoformat(t) + moved).isoformat()
        except (ValueError, OverflowError):  # a damaged database's value: compared as it is
            return t

    def offset_at(self, step: _Step) -> float | None:
        offset = super().offset_at(step)
        change = self.pending.get((step.step, "clock")) if step.kind == "call" else None
        shift = change.shift if change is not None else self.read_shift
        return offset if offset is None else offset + shift.total_seconds()

    # -- the changes -----------------------------------------------------------------------
    def _change_at(self, step: _Step, kind: str) -> Change | None:
        return self.pending.get((step.step, kind))

    def _take_change(self, change: Change) -> None:
        self.pending.pop(change.key, None)
        self.applied.append(str(change.site))
        self.forked = True

    def _change_for(self, kind: str, request: dict) -> Change | None:
        """After the divergence: an experiment's change whose request comes again."""
        if self.plan.strict:
            return None
        for change in self.pending.values():
            if change.site.name == kind and change.request is not None and _same_request(kind, change.request, request):
                return change
        return None

    def _answer_call(self, name, endpoint: str, body: dict, step: _Step, prompt: dict):
        change = self._change_at(step, "token") or self._change_at(step, "message")
        if change is None:
            return super()._answer_call(name, endpoint, body, step, prompt)
        self._take_change(change)
        self.cursor += 1
        self.calls += 1
        self.arm_clock()
        return self.live.generate(name, endpoint, body, forced=change.forced, settings=change.settings)

    def _live_call(self, name, endpoint: str, body: dict):
        change = self._change_for("token", body)
        if change is None:
            return super()._live_call(name, endpoint, body)
        self._take_change(change)
        return self.live.generate(name, endpoint, body, forced=change.forced, settings=change.settings)

    def _answer_sdk(self, step: _Step, recorded: dict, value: dict) -> dict:
        change = self._change_at(step, "tool")
        if change is None and self.start_files and self.tree is not None and "function" in recorded:
            return self._carry_files(step, recorded)
        if change is None:
            return super()._answer_sdk(step, recorded, value)
        self._take_change(change)
        new = _new_tool(recorded, change.value)
        events = [(e.kind, site_parts(e.site)[2], new if e.kind == "tool" else e.value) for e in step.events]
        self.recorder.record_copy(self.name, events)
        self.cursor += 1
        self.arm_clock()
        return _tool_answer(value, new)

    def _carry_files(self, step: _Step, recorded: dict) -> dict:
        """A pinned SDK function in a fork with new start-tree files: its recorded answer, its
        recorded effects on the files with the fork's files kept (setup_values.carry)."""
        from tttr.engine.program.setup_values import carry

        effects = carry(self.tree, recorded, self.rec.setup.get("snapshot"), self.start_files, self.recorder.store)
        self.recorder.record_copy(self.name, [(e.kind, site_parts(e.site)[2], {**e.value, **effects}
                                               if e.kind == "tool" else e.value) for e in step.events])
        self.cursor += 1
        self.answered += 1
        self.arm_clock()
        return {**effects, **({"error": recorded["error"]} if recorded.get("error") else {"result": recorded.get("result")})}

    def _answer_clock(self, step: _Step, recorded: dict) -> dict:
        change = self._change_at(step, "clock")
        if change is None and not self.forked:
            return super()._answer_clock(step, recorded)
        if change is not None:
            self._take_change(change)
            t = change.value
            if self.plan.strict:
                self.moved = change.shift
        else:  # after a change: the recorded read, moved as a strict fork moved the clock
            t = (datetime.fromisoformat(recorded["t"]) + self.moved).isoformat() if self.moved else recorded["t"]
            self.answered += 1
        self.recorder.record_copy(self.name, [(e.kind, site_parts(e.site)[2], {**e.value, "t": t}
                                               if e.kind == "clock" else e.value) for e in step.events])
        self.cursor += 1
        self.arm_clock()
        return {"t": t}

    def answer_call(self, name, endpoint: str, body: dict):
        if self.cancelled:
            return APIError("the fork was cancelled", status=410, code="fork_cancelled")  # 410: clients do not retry
        try:
            return super().answer_call(name, endpoint, body)
        finally:
            self._progress()

    @property
    def cancelled(self) -> bool:
        return self.plan.cancel is not None and self.plan.cancel.is_set()

    def _progress(self) -> None:
        if self.plan.progress is not None:
            total = len(self.rec.steps)
            where = "after the fork" if self.forked else "before the fork"
            self.plan.progress(min(self.cursor, total), total, f"step {self.cursor} of {total} recorded ({where})")

    def answer_sdk(self, name, kind: str, value: dict):
        try:
            answer = super().answer_sdk(name, kind, value)
        finally:
            self._progress()
        if answer is not None:
            return answer
        if kind == "tool" and (change := self._change_for("tool", value)) is not None:
            self._take_change(change)  # a live tool call that asks what the change's did: its value
            new = _new_tool({k: value.get(k) for k in _TOOL_REQUEST + ("tree_before",) if k in value}, change.value)
            self.recorder.record_copy(self.name, [("tool", None, {**new, "source": "sdk"})])
            return _tool_answer(value, new)
        live_shift = self.moved if self.plan.setup_change is None else timedelta(0)
        if kind == "clock" and self.forked and live_shift:
            # A live read after a moved clock read: moved the same. (After a moved setup clock,
            # the server's own clock already runs from the new time.)
            t = (self._live_clock() + live_shift).isoformat()
            self.recorder.record_copy(self.name, [("clock", None, {"t": t, "source": "sdk"})])
            return {"t": t}
        return None

    def report(self) -> dict:
        out = {**super().report(), "fork_site": str(self.plan.site), "forked": self.forked}
        if not self.plan.strict:
            out["applied"] = list(self.applied)
        return out


_TOOL_REQUEST = ("function", "args", "kwargs", "cmd", "cwd", "timeout_s")


def _same_request(kind: str, recorded: dict, live: dict) -> bool:
    if kind == "token":
        from tttr.engine.replay.divergence import first_request_difference

        return first_request_difference(recorded, live) is None
    keys = ("function", "args", "kwargs") if "function" in recorded else ("cmd", "cwd", "timeout_s")
    if "tree_before" in recorded and "tree_before" in live:  # sdk.shell's cassette: the same files too
        keys += ("tree_before",)
    return all(recorded.get(k) == live.get(k) for k in keys)


def _new_tool(recorded: dict, value: dict) -> dict:
    """A tool step's recorded value with a change's fields in place of its own."""
    new = {**recorded, **value}
    if "function" in recorded:
        if "result" in value and "error" not in value:
            new.pop("error", None)
        if "error" in value and "result" not in value:
            new.pop("result", None)
    elif "stdout" in value or "stderr" in value:
        _cut_outputs(new, recorded, value)
    return new


def _cut_outputs(new: dict, recorded: dict, value: dict) -> None:
    """A command's new outputs, kept as the SDK keeps a recorded command's (recorders/sdk.py):
    each past MAX_OUTPUT bytes keeps its first MAX_OUTPUT, and `truncated` with both whole
    sizes says that one was cut. An output the change leaves keeps its recorded size, so a
    new stdout beside a cut stderr stays truncated, and a new stdout in place of a cut one
    is whole."""
    from tttr.recorders.sdk import MAX_OUTPUT

    sizes = {}
    for key in ("stdout", "stderr"):
        if key in value:
            data = value[key].encode("utf-8", "surrogateescape")
            sizes[key] = len(data)
            if len(data) > MAX_OUTPUT:
                new[key] = data[:MAX_OUTPUT].decode("utf-8", "replace")
        else:
            old = recorded.get(key)
            size = recorded.get(f"{key}_size")
            if type(size) is not int:  # recorded whole: its text's size (a blob's is in its reference)
                size = old.get("size", 0) if isinstance(old, dict) else len((old or "").encode("utf-8", "surrogateescape"))
            sizes[key] = size
    if any(size > MAX_OUTPUT for size in sizes.values()):
        new.update(truncated=True, stdout_size=sizes["stdout"], stderr_size=sizes["stderr"])
    else:
        for key in ("truncated", "stdout_size", "stderr_size"):
            new.pop(key, None)


def _tool_answer(asked: dict, new: dict) -> dict:
    """What the SDK gets for a tool whose value is `new`, with the effects on the files (if
    recorded) that the server puts back."""
    effects = {k: new[k] for k in ("tree_after", "snapshot") if new.get(k)}
    if "function" in asked:
        return {**effects, **({"error": new["error"]} if new.get("error") else {"result": new.get("result")})}
    return {**effects, **{k: new.get(k) for k in ("stdout", "stderr", "exit_code", "limit_hit", "truncated")}}


def recorded_check(store, run) -> str | None:
    """The --check a program run was recorded with: its own, or the recording's it was forked or replayed from."""
    seen = set()
    while run is not None and run.id not in seen:
        seen.add(run.id)
        if run.meta.check is not None:
            return run.meta.check
        run = store.run(run.parent) if run.parent is not None else None
    return None


__all__ = ["Change", "ForkPlan", "ForkReplayer", "check_program_fork", "recorded_check", "shared_before"]
