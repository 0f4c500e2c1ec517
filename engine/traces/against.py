"""A user's program replayed, or forked, against an imported trace (`tttr replay IMPORTED --
PROGRAM`, `tttr fork IMPORTED --at SITE --set VALUE -- PROGRAM`).

The program runs as `tttr record -- PROGRAM` runs it (in the sandbox, from an empty tree or
the files of `--code DIR`, with a virtual clock and seeded randomness), through the recorded
program's replay (engine/program/replay.py: `replay_program` with this module's plan as its
`fork` and the trace's steps as its `recording`). The trace's steps are met in order
(engine/traces/trace_replayer.py):

- a model call (OpenAI chat or completions, the Responses API, Anthropic Messages: each reaches
  the replayer as a chat request) is answered with the trace's answer (text, tool calls,
  finish reason) while its messages equal the trace's input messages (what is compared:
  engine/traces/matching.py);
- an SDK tool call (`@sdk.tool`, `sdk.shell`) is answered with the trace's tool result (or
  error) when its name and arguments match (matching.py); an answered tool does not run, and
  has no effect on the files (a trace holds no file trees); a trace's tool call the program does
  not ask the SDK for before its next model call (a tool it runs itself) is passed over: its
  result is compared where it shows, in that call's messages;
- clock reads are live (the virtual clock, logical per read): a trace holds none.

The first request that differs (another kind of step, another message or argument, a step the
trace lacks, or a trace step the program never asked for) is the divergence, reported with both
values. `--sealed` ends there (each later call gets an error); else the rest runs live: model
calls on the engine here (any model name the program sends) or on `--upstream URL`
(engine/traces/upstream.py), SDK tools for real.

A fork changes one value first: a model call's answer (`S:message`: text, or JSON with `text`
and/or `tool_calls`) or a tool's result (`S:tool`: the recorded program's fork grammar). The
program gets the new value where it asks that step (with the request matching up to there),
then goes on as a replay: answered from the trace while its requests match.

The replay is a new run of the recorded-program kind (task `program:NAME`, meta.source `tttr
record`, meta.against naming the trace), whose parent is the imported run: it holds the start
tree, each call's request and answer and each tool's value as a recording does, so it replays
and forks like any recorded program. Everything is checked (the trace's content, the site, the
value, the program's file) before anything is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from tttr.engine.program.replay import _Event, _Recording, _script, _Step, replay_program
from tttr.engine.traces.errors import TraceError
from tttr.engine.traces.matching import COMPARED
from tttr.sessions.records import RunMeta

DEFAULT_CLOCK = "2026-01-01T00:00:00"
SITES = "a model call's answer (STEP:message) or a tool's result (STEP:tool)"


# ---------------------------------------------------------------------------- the trace's steps
def _step_problem(kind: str, value: dict) -> str | None:
    """What a trace step lacks for a program's replay (its content), or None."""
    if kind == "message":
        missing = [m for m in (value.get("missing") or []) if isinstance(m, str)]
        if missing or not isinstance(value.get("input"), list):
            return f"has no {' or '.join(missing) or 'input messages'}"
        return None
    if "cmd" in value or "result" in value or isinstance(value.get("error"), dict):
        return None
    return "has no result"


def _damage(kind: str, value: dict) -> str | None:
    """A value of the wrong shape (a damaged or hand-edited database), or None."""
    if kind == "message":
        if not isinstance(value.get("text"), (str, type(None))) or not isinstance(value.get("tool_calls") or [], list) \
                or not all(isinstance(m, dict) for m in value["input"]):
            return "its text, tool calls or input messages are not text, a list and a list of objects"
        return None
    if "cmd" in value:
        return None if isinstance(value["cmd"], str) else "its command is not text"
    if not isinstance(value.get("function"), str) or not isinstance(value.get("args", []), list) \
            or not isinstance(value.get("kwargs", {}), dict):
        return "its function, args or kwargs are not text, a list and an object"
    return None


def trace_steps(reader, run) -> list:
    """The imported run's model calls and tool calls as a recording's steps (kind "call" or
    "tool", the trace's value as the one event); TraceError (one line) when a step lacks the
    content a program's replay needs."""
    from tttr.engine.replay.events import read_text
    from tttr.sessions.errors import StoreError

    try:
        _, events = reader.load_run(run.id)
    except StoreError as exc:
        raise TraceError(str(exc)) from None
    steps = []
    for e in events:
        if e.kind not in ("message", "tool") or e.step < 0:
            continue
        if not isinstance(e.value, dict):
            raise TraceError(f"run {run.id}, site {e.site}: the value is not an object; the database is damaged")
        value = dict(e.value)
        problem = _step_problem(e.kind, value)
        if problem is not None:
            what = "model call" if e.kind == "message" else "tool call"
            raise TraceError(f"run {run.id}'s {what} at {e.site} {problem}: a program is replayed against a trace's "
                             "content; export the trace with its messages and tool results (the GenAI conventions' "
                             "opt-in content, `tttr export --content`) and import it again")
        damage = _damage(e.kind, value)
        if damage is not None:
            raise TraceError(f"run {run.id}, site {e.site}: {damage}; the database is damaged")
        if isinstance(value.get("stdout"), dict):  # a large output kept as a blob
            value["stdout"] = read_text(reader, value["stdout"])
        steps.append(_Step(e.step, "call" if e.kind == "message" else "tool", [_Event(e.kind, value, e.site)]))
    if not steps:
        raise TraceError(f"run {run.id} is an imported trace with no model call or tool call: there is nothing to "
                         "answer a program's requests with")
    return steps


def _root_facts(run) -> dict:
    """What the trace's root span says of the run tttr exported it from (its `tttr.setup` and
    `tttr.program.end` events, its seed) and its start time, or {} when it is not kept."""
    from tttr.engine.traces.spans import Span

    kept = run.meta.trace or {}
    for r in kept.get("others") or []:
        if isinstance(r, dict) and isinstance(r.get("span"), dict) and r["span"].get("spanId") == kept.get("root"):
            try:
                return _facts(Span.from_record(r["span"]))
            except TraceError:  # a damaged record: the trace's facts are not needed to run
                return {}
    return {}


def _facts(span) -> dict:
    out: dict = {"start_ns": span.start_ns}
    if type(span.attributes.get("gen_ai.request.seed")) is int:
        out["seed"] = span.attributes["gen_ai.request.seed"]
    for event in span.events:
        a = event.attributes
        if event.name == "tttr.setup" and isinstance(a.get("tttr.setup.clock"), str):
            out["clock"] = a["tttr.setup.clock"]
        if event.name == "tttr.program.end":
            if type(a.get("tttr.exit_code")) is int:
                out["exit_code"] = a["tttr.exit_code"]
            if isinstance(a.get("tttr.stdout"), str):
                out["stdout"] = a["tttr.stdout"]
    return out


def _clock(facts: dict) -> datetime:
    """The virtual clock the program starts at: the recorded run's (a tttr export), else the
    trace's start, to the second; else a fixed one, so that two replays read the same."""
    from tttr.recorders.clock import normalize_clock
    from tttr.recorders.errors import SandboxError

    candidates = []
    if "clock" in facts:
        try:
            candidates.append(datetime.fromisoformat(facts["clock"]))
        except ValueError:
            pass
    if type(facts.get("start_ns")) is int:
        try:
            candidates.append(datetime.fromtimestamp(facts["start_ns"] // 1_000_000_000, timezone.utc))
        except (OverflowError, OSError, ValueError):
            pass
    for t in candidates:
        try:
            return normalize_clock(t)
        except SandboxError:
            continue
    return datetime.fromisoformat(DEFAULT_CLOCK)


# ---------------------------------------------------------------------------- the plan
@dataclass(slots=True)
class TraceChange:
    """A fork's one new value: at `site` (a Site), `value` (a message's {text, tool_calls,
    finish_reason}, or a tool's replaced fields), `text` as given."""

    site: object
    value: dict
    text: str


@dataclass(slots=True)
class AgainstTrace:
    """A checked replay (or fork) of a program against imported run `run_id`: what
    engine/program/replay.py's `replay_program` takes as its `recording` and its `fork`."""

    run_id: int
    recording: object  # engine/program/replay.py's _Recording, made of the trace's steps
    argv: tuple[str, ...]
    code: str | None = None
    sealed: bool = False
    model: str | None = None
    change: TraceChange | None = None
    unsafe_no_sandbox: bool = False
    upstream: str | None = None  # --upstream URL (its API root): live calls go there, not to the engine here
    upstream_key_env: str | None = None  # the environment variable holding its API key (read when it runs)
    check: str | None = None  # no --check: a trace has no verdict to compare
    cancel: object = None
    meta: dict = field(default_factory=dict)

    @property
    def verb(self) -> str:
        """How replay_program's progress names what it does."""
        return "forking" if self.change is not None else "replaying"

    # -- what replay_program asks of a fork plan -------------------------------------------
    def start_clock(self, recorded: datetime) -> datetime:
        return recorded

    def run_seed(self, recorded: int | None) -> int | None:
        return recorded

    def lay_setup(self, setup: dict, tree_dir, store) -> dict:
        """The start tree: the files of --code laid into the empty `tree_dir` (nothing without
        it), kept in `store` as the child's start snapshot, so that it replays as a recorded
        program."""
        from tttr.engine.program.replay import lay_code
        from tttr.recorders.snapshot import snapshot

        if self.code is not None:
            lay_code(self.code, tree_dir)
        start = snapshot(tree_dir, store)
        return {**setup, "tree": start, "snapshot": start}

    def columns(self) -> dict:
        change = self.change
        mutation = {"site": str(change.site), "value": change.value, "input": change.text} if change else None
        return {"fork_seq": 0, "fork_site": str(change.site) if change else None, "mutation": mutation,
                "meta": self.meta}

    def adopt(self, recorder, child: int, setup: dict, setup_clock: dict | None = None) -> None:
        """The child begins as a recording does: its clock, then its setup (lay_setup's)."""
        from tttr.sessions.vocabulary import SETUP_STEP, site

        store = recorder.store
        recorder.adopt(recorder.default_run, child)
        if setup_clock is not None:
            store.append(child, site(SETUP_STEP, "clock"), setup_clock)
        store.append(child, site(SETUP_STEP, "setup"), setup)
        store.commit_step(child)

    def replayer(self, rec, recorder, name: str):
        from tttr.engine.traces.trace_replayer import TraceReplayer

        return TraceReplayer(rec, recorder, name, self)


def _new_message(text: str) -> dict:
    """A model answer's new value: text, or a JSON object with `text` (or `content`) and/or
    `tool_calls` (OpenAI's shape) and `finish_reason`."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if isinstance(value, dict) and value and set(value) <= {"text", "content", "tool_calls", "finish_reason"}:
        body = value.get("text", value.get("content")) or ""
        calls = value.get("tool_calls") or []
        if not isinstance(body, str) or not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function"), dict)
                and isinstance(c["function"].get("name"), str) for c in calls):
            raise TraceError("a model answer's JSON is {\"text\": TEXT, \"tool_calls\": [{\"id\", \"type\": "
                             "\"function\", \"function\": {\"name\", \"arguments\"}}]}; or give plain text")
        calls = [{"id": c.get("id") or f"call_{i}", "type": "function",
                  "function": {"name": c["function"]["name"], "arguments": c["function"].get("arguments") if
                               isinstance(c["function"].get("arguments"), str) else json.dumps(
                                   c["function"].get("arguments") or {})}} for i, c in enumerate(calls)]
        finish = value.get("finish_reason") if isinstance(value.get("finish_reason"), str) else (
            "tool_calls" if calls else "stop")
        return {"text": body, "tool_calls": calls, "finish_reason": finish}
    return {"text": text, "tool_calls": [], "finish_reason": "stop"}


def _check_change(run, steps: list, site_text: str, value_text: str) -> TraceChange:
    from tttr.engine.program.fork import _sdk_value
    from tttr.engine.program.record import ProgramRunError
    from tttr.sessions.vocabulary import Site, SiteError

    try:
        at = Site.parse(site_text)
    except (SiteError, ValueError) as exc:
        raise TraceError(f"{exc}; an imported trace forks at {SITES}") from None
    if at.name not in ("message", "tool") or at.pos is not None:
        raise TraceError(f"an imported trace forks at {SITES}, not {at}: it holds no tokens, clock reads or setup")
    step = next((s for s in steps if s.step == at.step and s.events[0].kind == at.name), None)
    if step is None:
        raise TraceError(f"run {run.id} has no {'model call' if at.name == 'message' else 'tool call'} at {at}: "
                         f"`tttr events DB {run.id}` lists its sites")
    if at.name == "message":
        return TraceChange(at, _new_message(value_text), value_text)
    recorded = step.events[0].value
    try:
        value = _sdk_value(value_text, recorded)
    except (ProgramRunError, ValueError) as exc:
        raise TraceError(str(exc)) from None
    return TraceChange(at, value, value_text)


def check_against(reader, run, *, argv=(), code: str | None = None, sealed: bool = False, model: str | None = None,
                  unsafe_no_sandbox: bool = False, site: str | None = None, value: str | None = None,
                  upstream: str | None = None, upstream_key_env: str | None = None) -> AgainstTrace:
    """Everything a program's replay (or, with `site` and `value`, fork) against imported run
    `run` needs, checked read-only; TraceError (one line) when it cannot run."""
    from tttr.recorders.clock import iso

    verb = "fork" if site is not None else "replay"
    if not argv:
        raise TraceError(f"run {run.id} is an imported trace: it holds no program, so `tttr {verb}` runs yours "
                         f"against it: `tttr {verb} {run.id}{' --at SITE --set VALUE' if site else ''} --code DIR -- "
                         "python3 agent.py` (its model calls and SDK tools answered from the trace)")
    argv = tuple(str(a) for a in argv)
    script = _script(list(argv))
    if code is None and script is not None:
        raise TraceError(f"the program's file {script} is not in the trace (it holds no files): pass the folder that "
                         f"holds it with --code DIR")
    if code is not None:
        folder = Path(code)
        if not folder.is_dir():
            raise TraceError(f"--code {code!r} is not a directory: give the folder that holds your program's files")
        if script is not None and not (folder / script).is_file():
            raise TraceError(f"--code {code!r} holds no {script}, the program after -- ({' '.join(argv)})")
    if upstream_key_env is not None and upstream is None:
        raise TraceError("--upstream-key-env names the key of --upstream URL: give --upstream, or drop it")
    if upstream is not None:
        from tttr.engine.traces.upstream import check_upstream

        if sealed:
            raise TraceError("--sealed runs nothing live, and --upstream is where live calls go: drop one")
        upstream = check_upstream(upstream, upstream_key_env)[0]
    if run.status != "complete":
        raise TraceError(f"run {run.id} is {run.status}: only a complete import can be replayed against")
    steps = trace_steps(reader, run)
    change = _check_change(run, steps, site, value) if site is not None else None
    facts = _root_facts(run)
    clock = _clock(facts)
    seed = facts.get("seed", 0)
    name = f"program:{Path(argv[0]).name}"
    against = {"trace": run.id, "compared": COMPARED, **({"sealed": True} if sealed else {}),
               **({"code": True} if code is not None else {})}
    meta = {"source": "tttr record", "program": list(argv), "clock": iso(clock), "against": against}
    synthetic = replace(run, task=name, kernel_mode="invariant", sampling={}, seed=seed, fingerprint={},
                        meta=RunMeta.of(name, {"program": list(argv), "clock": iso(clock)}))
    final = {k: facts[k] for k in ("exit_code", "stdout") if k in facts}  # what the trace says of the end, if anything
    setup = {"task": name, "clock": iso(clock), "program": list(argv)}
    rec = _Recording(synthetic, setup, steps, final, None, {"t": iso(clock)})
    if upstream is not None:
        from tttr.engine.serve.proxy import shown_url

        against["upstream"] = shown_url(upstream)
    return AgainstTrace(run.id, rec, argv, code, sealed, model, change, unsafe_no_sandbox, upstream, upstream_key_env,
                        meta=meta)


def run_against(db: str, plan: AgainstTrace, progress=None):
    """Act on a checked plan: the program run against the trace, written as a new run."""
    # --code is the plan's to lay (lay_setup): the start tree it snapshots is the one the program runs from
    return replay_program(db, plan.run_id, unsafe_no_sandbox=plan.unsafe_no_sandbox, progress=progress, fork=plan,
                          argv=list(plan.argv), sealed=plan.sealed, recording=plan.recording)


__all__ = ["AgainstTrace", "check_against", "run_against"]
