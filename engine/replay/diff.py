"""Compare two runs: align their steps by the actions taken, and find, per layer, the
first site where their values differ and how many sites of that layer differ in all.

Steps are aligned by edit distance over the action sequences (rapidfuzz), so an extra or
a missing command in one run shifts the alignment instead of marking every later step
as different. A recorded program's run has no actions: each of its steps (a model call's
message, an SDK tool's call and result, a clock read, the program's end) is aligned instead.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rapidfuzz.distance import Levenshtein

from tttr.sessions.safe_text import brief
from tttr.sessions.vocabulary import KIND_LAYER, LAYERS, site_order, site_parts

# What counts as "the value" of an event when comparing two runs, per kind.
_COMPARED = {
    "clock": ("t",),
    "tool": ("stdout", "stderr", "exit_code", "result", "error"),  # a command's outcome, or an SDK function's
    "token": ("id",),
    "logits": ("digest",),
    "action": ("cmd", "done"),
    "setup": ("tree", "exports"),  # the start tree and the variables a run starts with
}


@dataclass(frozen=True, slots=True)
class Divergence:
    """The first site of one layer where two runs' values differ (or that only one has).
    `a` is the first run's value — in a replay or fork, the recording's — and `b` the
    second's, the live one; `names` says which is which in messages and in JSON."""

    site: str
    layer: str
    a: Any
    b: Any
    names: tuple[str, str] = ("a", "b")
    absent: str = ""  # "a" or "b": the run that has no event at this site (its value is None)

    def shown(self, side: str, width: int = 60) -> str:
        """One side's value as a person reads it: a site that run does not have says so."""
        if self.absent == side:
            return "(no such event)"
        return brief(self.a if side == "a" else self.b, width)

    def describe(self) -> str:
        first, second = self.names
        return f"{self.site} ({self.layer} layer): {first} {self.shown('a')}, {second} {self.shown('b')}"

    def to_json(self) -> dict:
        first, second = self.names
        return {"site": self.site, "layer": self.layer, first: self.a, second: self.b}


@dataclass(frozen=True, slots=True)
class DiffRow:
    a_step: int | None
    b_step: int | None
    a_action: str | None
    b_action: str | None
    same: bool


@dataclass(frozen=True, slots=True)
class PromptChange:
    """Where the request of the first model call whose prompts differ parts: its step,
    what differs (`message 2`, `parameter max_tokens`) and both values."""

    step: int
    what: str
    a: Any
    b: Any

    def to_json(self) -> dict:
        return {"step": self.step, "what": self.what, "a": self.a, "b": self.b}


@dataclass(slots=True)
class RunDiff:
    run_a: int
    run_b: int
    rows: list[DiffRow] = field(default_factory=list)
    first_divergence: dict[str, Divergence] = field(default_factory=dict)
    # Per layer with a divergence: how many of its sites differ (or only one run has),
    # the first included.
    differing_sites: dict[str, int] = field(default_factory=dict)
    prompt_change: PromptChange | None = None  # recorded programs and served calls: the first differing request
    # Steps whose clock was read before their model call (a recorded program's `S:clock`, taken
    # as the request came), where the agent's clock of a step is read after its message.
    clock_first: frozenset = frozenset()

    @property
    def identical(self) -> bool:
        return not self.first_divergence and all(r.same for r in self.rows)

    @property
    def first_cause(self) -> Divergence | None:
        """The earliest divergence of any layer, in the order the run consumed its values (a
        clock read before the tokens it changed): the first cause, where the others follow."""
        return min(self.first_divergence.values(), key=lambda d: consumed_order(d.site, self.clock_first),
                   default=None)

    def by_cause(self) -> list[Divergence]:
        """Each layer's first divergence, the first cause first, then the rest by layer."""
        first = self.first_cause
        return [] if first is None else [first, *(d for d in self.first_divergence.values() if d is not first)]

    def to_json(self) -> dict:
        first = self.first_cause
        return {
            "run_a": self.run_a,
            "run_b": self.run_b,
            "identical": self.identical,
            "first_cause": None if first is None else first.to_json(),
            "first_divergence": {k: v.to_json() for k, v in self.first_divergence.items()},
            "prompt_change": None if self.prompt_change is None else self.prompt_change.to_json(),
            "differing_sites": dict(self.differing_sites),
            "rows": [
                {"a_step": r.a_step, "b_step": r.b_step, "a_action": r.a_action,
                 "b_action": r.b_action, "same": r.same}
                for r in self.rows
            ],
        }


def consumed_order(text: str, clock_first: frozenset = frozenset()) -> tuple:
    """`site_order`, but a clock read at one of the `clock_first` steps comes before the
    step's model call: the order a recorded program consumed them in."""
    key = site_order(text)
    parts = site_parts(str(text))
    if parts is not None and parts[1] == "clock" and parts[0] in clock_first:
        return (key[0], -1, *key[2:])
    return key


def clock_first_steps(*runs: list) -> frozenset:
    """The steps at which a run's events hold a clock read recorded before its prompt (`consumed_order`)."""
    out = set()
    for events in runs:
        clocks = {e.step: e.seq for e in events if e.kind == "clock"}
        out |= {e.step for e in events if e.kind == "prompt" and e.step in clocks and clocks[e.step] < e.seq}
    return frozenset(out)


def first_request_difference(a: dict, b: dict) -> tuple[str, Any, Any] | None:
    """(what, a's value, b's value) of the first message, then parameter, where two model
    requests (OpenAI chat or completions bodies) differ; None when they are the same."""
    a_msgs, b_msgs = a.get("messages"), b.get("messages")
    if isinstance(a_msgs, list) and isinstance(b_msgs, list):
        for i in range(max(len(a_msgs), len(b_msgs))):
            x = a_msgs[i] if i < len(a_msgs) else None
            y = b_msgs[i] if i < len(b_msgs) else None
            if x != y:
                return f"message {i}", x, y
    elif a_msgs != b_msgs:
        return "messages", a_msgs, b_msgs
    for key in sorted((set(a) | set(b)) - {"messages"}):
        if a.get(key) != b.get(key):
            return f"parameter {key}", a.get(key), b.get(key)
    return None


def prompt_change(a_events: list, b_events: list) -> PromptChange | None:
    """The first step (in order) at which both runs made a model call with a recorded request
    and the requests differ (a recorded program's or a served API's runs)."""
    def requests(events) -> dict[int, dict]:
        return {e.step: e.value["request"] for e in events if e.kind == "prompt" and isinstance(e.value, dict)
                and isinstance(e.value.get("request"), dict)}

    a, b = requests(a_events), requests(b_events)
    for step in sorted(set(a) & set(b)):
        found = first_request_difference(a[step], b[step])
        if found is not None:
            return PromptChange(step, *found)
    return None


def action_text(value: dict) -> str:
    return "done" if value.get("done") else str(value.get("cmd", ""))


def compared_value(kind: str, value: Any) -> Any:
    keys = _COMPARED.get(kind)
    if keys is None or not isinstance(value, dict):
        return value
    picked = {k: value.get(k) for k in keys if k in value}
    return picked[keys[0]] if len(keys) == 1 else picked


def align(a: list[str], b: list[str]) -> list[DiffRow]:
    """Pair up two action sequences by edit distance; rows in order of both runs.

    Runs of equal actions pair one to one. Between two such runs, the differing steps of
    both sides pair in order (a replace), and whichever side has more keeps its extra steps
    at the end of the gap, so a step is never paired with one far from it."""
    rows: list[DiffRow] = []
    gap_a: list[int] = []
    gap_b: list[int] = []

    def flush() -> None:
        for k in range(max(len(gap_a), len(gap_b))):
            i = gap_a[k] if k < len(gap_a) else None
            j = gap_b[k] if k < len(gap_b) else None
            rows.append(DiffRow(i, j, a[i] if i is not None else None, b[j] if j is not None else None, False))
        gap_a.clear()
        gap_b.clear()

    for op in Levenshtein.opcodes(a, b):
        if op.tag == "equal":
            flush()
            for i, j in zip(range(op.src_start, op.src_end), range(op.dest_start, op.dest_end)):
                rows.append(DiffRow(i, j, a[i], b[j], True))
        else:
            gap_a.extend(range(op.src_start, op.src_end))
            gap_b.extend(range(op.dest_start, op.dest_end))
    flush()
    return rows


class Divergences(NamedTuple):
    first: dict[str, Divergence]  # per layer, its first differing site
    counts: dict[str, int]  # per layer with a divergence, how many of its sites differ, the first included


def divergences(a_events: list, b_events: list) -> Divergences:
    """Per layer: the first site (in step/position order) whose compared value differs or
    that only one run has, and how many such sites the layer has in all."""
    by_layer: dict[str, dict[str, dict[str, Any]]] = {}
    for side, events in (("a", a_events), ("b", b_events)):
        for e in events:
            if e.kind not in _COMPARED:
                continue
            layer = KIND_LAYER[e.kind]
            by_layer.setdefault(layer, {}).setdefault(e.site, {})[side] = compared_value(e.kind, e.value)
    return _first_per_layer(by_layer)


def _first_per_layer(by_layer: dict[str, dict[str, dict[str, Any]]]) -> Divergences:
    first: dict[str, Divergence] = {}
    counts: dict[str, int] = {}
    for layer in LAYERS:
        sites = by_layer.get(layer, {})
        differing = [s for s, pair in sites.items() if pair.get("a", _MISSING) != pair.get("b", _MISSING)]
        if differing:
            at = min(differing, key=site_order)
            pair = sites[at]
            absent = "a" if "a" not in pair else "b" if "b" not in pair else ""
            first[layer] = Divergence(at, layer, pair.get("a"), pair.get("b"), absent=absent)
            counts[layer] = len(differing)
    return Divergences(first, counts)


_MISSING = object()


PROGRAM_STEP_KINDS = ("message", "tool", "clock")


class ProgramStep(NamedTuple):
    step: int
    kind: str  # one of PROGRAM_STEP_KINDS
    key: str  # what is aligned: the same key, the same step


def program_steps(events: list) -> list[ProgramStep]:
    """The steps of a run of recorded API calls (a recorded program's), in the order they
    were recorded: a call's message, an SDK tool's call with its result, a clock read, the
    program's end. `tttr diff` and the compare screen align these (one row per step), so a
    fork at an SDK tool's result or a clock read differs on its own row."""
    picked = sorted((e for e in events if e.kind in PROGRAM_STEP_KINDS and e.step >= 0 and not _call_clock(e)),
                    key=lambda e: e.seq)
    return [ProgramStep(e.step, e.kind, _program_key(e.kind, e.value if isinstance(e.value, dict) else {}))
            for e in picked]


def _call_clock(e) -> bool:
    """A recorded program's own clock read before a model call (part of the call's step, not a
    row of its own: compared site by site, `S:clock`)."""
    return e.kind == "clock" and isinstance(e.value, dict) and e.value.get("source") == "program"


def _program_key(kind: str, v: dict) -> str:
    def text(x) -> str:
        return json.dumps(x, ensure_ascii=False, sort_keys=True, default=str)

    if kind == "message":
        calls = v.get("tool_calls")
        return str(v.get("text") or "") + (f" → tool calls {text(calls)}" if calls else "")
    if kind == "clock":
        return f"clock {v.get('t', '')}"
    if "function" in v:  # an @sdk.tool call
        args = [text(a) for a in v.get("args") or []]
        kwargs = v.get("kwargs") if isinstance(v.get("kwargs"), dict) else {}
        args += [f"{k}={text(a)}" for k, a in kwargs.items()]
        end = f" ✗ {text(v['error'])}" if v.get("error") is not None else f" → {text(v.get('result'))}"
        return f"{v['function']}({', '.join(args)}){end}"
    if isinstance(v.get("program"), list):  # the program's own end, with its output: a fork that prints otherwise differs here
        return f"end: {' '.join(str(a) for a in v['program'])} (exit {v.get('exit_code')}){_output(v.get('stdout'))}"
    return f"$ {v.get('cmd', '')} (exit {v.get('exit_code')})"  # sdk.shell


def _output(stdout) -> str:
    """The program's stdout in a few words: its last line (inline text), or its size and
    content hash (a blob), so that two different outputs never read the same."""
    if isinstance(stdout, dict) and isinstance(stdout.get("$blob"), str):
        return f" · stdout {stdout.get('size')} bytes #{stdout['$blob'][:12]}"
    if not isinstance(stdout, str) or not stdout.strip():
        return ""
    lines = stdout.rstrip("\n").split("\n")
    last = lines[-1] if len(lines[-1]) <= 60 else lines[-1][:59] + "…"
    more = f" ({len(lines)} lines, {hashlib.blake2b(stdout.encode('utf-8', 'surrogateescape'), digest_size=6).hexdigest()})" \
        if len(lines) > 1 or last != lines[-1] else ""
    return f" · stdout {json.dumps(last, ensure_ascii=False)}{more}"


def diff_runs(store, run_a: int, run_b: int) -> RunDiff:
    """The two runs' aligned steps and per-layer divergences, every value of both decoded
    and checked first (a run with any unreadable value is refused: StoreError)."""
    # Unknown ids, and a run with any unreadable value, fail here in one line with the store's message.
    _, a_events = store.load_run(run_a)
    _, b_events = store.load_run(run_b)
    a_actions = [action_text(e.value) for e in a_events if e.kind == "action"]
    b_actions = [action_text(e.value) for e in b_events if e.kind == "action"]
    if not a_actions and not b_actions:  # recorded API calls (a program's): every step is aligned
        a_actions = [p.key for p in program_steps(a_events)]
        b_actions = [p.key for p in program_steps(b_events)]
    first, counts = divergences(a_events, b_events)
    return RunDiff(run_a, run_b, align(a_actions, b_actions), first, counts, prompt_change(a_events, b_events),
                   clock_first_steps(a_events, b_events))




# ---------------------------------------------------------------------------- a quick scan
class ScanCancelled(Exception):
    """`scan_runs` was asked to stop (its `cancelled()` said so)."""


SCAN_BATCH = 2_000  # rows read between two cancel checks (a batch holds the GIL while it is fetched)


def scan_runs(store, run_a: int, run_b: int, *, progress=None, cancelled=None) -> RunDiff:
    """`diff_runs`, for readers that must stay quick on long runs (the app's compare).

    The same RunDiff for runs whose values are readable, in a fraction of the time: the
    bulk of a run, its token and logits binary records, is compared by the token id or the
    digest read straight from the record's bytes, never decoded into a value and checked.
    Every other event (actions, tool results, clocks, messages, JSON-stored tokens) is
    decoded and checked as `diff_runs` does, and refuses the runs the same way when it
    cannot be read. `progress(done, total)` is called as rows are read; `cancelled()`,
    checked as often, raises ScanCancelled when it says True."""
    from tttr.sessions.errors import StoreError
    from tttr.sessions.safe_text import visible

    for run_id in (run_a, run_b):
        _check_readable(store, run_id)
    total = store.count_events(run_a) + store.count_events(run_b)
    done = 0
    if progress is not None:
        progress(done, total)
    keyed: dict[str, dict[str, dict[str, Any]]] = {}  # layer -> site -> side -> compared value
    events: dict[str, list] = {}  # side -> the decoded events (all but binary tokens and logits), in order
    for side, run_id in (("a", run_a), ("b", run_b)):
        decoded = events[side] = []
        for rows in store.raw_events(run_id, SCAN_BATCH):
            if cancelled is not None and cancelled():
                raise ScanCancelled()
            for raw in rows:
                quick = _quick_value(raw)
                if quick is not None:
                    site, value = quick
                    kind = raw.kind
                else:
                    e = store.decode_raw(run_id, raw)
                    if e.problem:
                        where = "" if e.origin == run_id else f" (recorded by run {e.origin})"
                        raise StoreError(f"run {run_id}, site {visible(e.site, newlines=False)}{where}: "
                                         f"{visible(e.problem, newlines=False)}")
                    decoded.append(e)
                    if e.kind not in _COMPARED:
                        continue
                    kind, site, value = e.kind, e.site, compared_value(e.kind, e.value)
                keyed.setdefault(KIND_LAYER[kind], {}).setdefault(site, {})[side] = value
            done += len(rows)
            if progress is not None:
                progress(done, total)
    a_actions = [action_text(e.value) for e in events["a"] if e.kind == "action"]
    b_actions = [action_text(e.value) for e in events["b"] if e.kind == "action"]
    if not a_actions and not b_actions:
        a_actions = [p.key for p in program_steps(events["a"])]
        b_actions = [p.key for p in program_steps(events["b"])]
    first, counts = _first_per_layer(keyed)
    return RunDiff(run_a, run_b, align(a_actions, b_actions), first, counts, prompt_change(events["a"], events["b"]),
                   clock_first_steps(events["a"], events["b"]))


def _check_readable(store, run_id: int) -> None:
    """What `Store.load_run` refuses before it reads an event: an unknown run, or a run
    (or a run it shares events with) whose row cannot be read."""
    from tttr.sessions.errors import StoreError
    from tttr.sessions.safe_text import visible

    run = store.run(run_id)
    if run.problem:
        raise StoreError(f"run {run_id}: {visible(run.problem, newlines=False)}")
    for ancestor in (a for a in store.sources(run_id) if a != run_id):
        problem = store.run(ancestor).problem
        if problem:
            raise StoreError(f"run {run_id} shares the events of run {ancestor}, which cannot be read: "
                             f"{visible(problem, newlines=False)}")


def _quick_value(raw) -> tuple[str, Any] | None:
    """(site, compared value) of a token or logits binary record in its usual form, read
    from its bytes (`codec.peek`); None for any other row, which the caller decodes and
    checks: the setup step, a stored site, a damaged column take the store's own path."""
    from tttr.sessions import codec

    step, pos = raw.step, raw.pos
    if raw.site is not None or type(step) is not int or type(pos) is not int \
            or not (0 <= step < 2**31 and 0 <= pos <= 2**32) or raw.kind not in ("token", "logits"):
        return None
    peeked = codec.peek(raw.value)
    if peeked is None or peeked[0] != raw.kind:
        return None
    return f"{step}:{raw.kind}:{pos}", peeked[1]
