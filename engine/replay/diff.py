"""Compare two runs: align their steps by the actions taken, and find, per layer, the
first site where their values differ and how many sites of that layer differ in all.

Steps are aligned by edit distance (rapidfuzz), so an extra or a missing command in one run
shifts the alignment instead of marking every later step as different. Each run's kind says
what its steps are (`kind_of(run).steps(events)`, engine/replay/steps.py): the built-in agent's
actions, or a run of model calls' steps (a call's message, an SDK tool's call and result, a
clock read, the program's end).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from rapidfuzz.distance import Levenshtein

from tttr.engine.kinds import kind_of
from tttr.engine.replay.divergence import COMPARED, Divergence, compared_value, first_request_difference, token_label
from tttr.sessions.vocabulary import KIND_LAYER, LAYERS, site_order, site_parts

# Divergence, first_request_difference and token_label live in engine/replay/divergence.py (the
# oracle and the replays import them from there); `tttr.engine.replay.diff` names them too.
__all__ = ["Divergence", "DiffRow", "PromptChange", "RunDiff", "ScanCancelled", "align", "clock_first_steps",
           "consumed_order", "diff_runs", "divergences", "first_request_difference", "prompt_change", "scan_runs",
           "token_label"]

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
    # Why no row can pair up: the runs' kinds describe their steps differently (an agent's
    # actions beside a program's calls); what `tttr diff` says on stderr. Not in the JSON.
    note: str | None = None

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
            if e.kind not in COMPARED:
                continue
            layer = KIND_LAYER[e.kind]
            by_layer.setdefault(layer, {}).setdefault(e.site, {})[side] = compared_value(e.kind, e.value)
    found = _first_per_layer(by_layer)
    token = found.first.get("token")
    if token is not None:  # its two texts, from the token events already decoded
        found.first["token"] = replace(token, texts=(_token_text(a_events, token.site), _token_text(b_events, token.site)))
    return found


def _token_text(events: list, at: str) -> str | None:
    text = next((e.value.get("text") for e in events if e.kind == "token" and e.site == at
                 and isinstance(e.value, dict)), None)
    return text if isinstance(text, str) else None


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


def diff_runs(store, run_a: int, run_b: int) -> RunDiff:
    """The two runs' aligned steps and per-layer divergences, every value of both decoded
    and checked first (a run with any unreadable value is refused: StoreError)."""
    # Unknown ids, and a run with any unreadable value, fail here in one line with the store's message.
    a_run, a_events = store.load_run(run_a)
    b_run, b_events = store.load_run(run_b)
    first, counts = divergences(a_events, b_events)
    return _diff(a_run, b_run, a_events, b_events, first, counts)


def _diff(a_run, b_run, a_events: list, b_events: list, first: dict, counts: dict) -> RunDiff:
    """The RunDiff of two runs whose divergences are found: each run's steps as its kind
    describes them (`RunKind.steps`), aligned."""
    a_kind, b_kind = kind_of(a_run), kind_of(b_run)
    a_steps = [s.key for s in a_kind.steps(a_events)]
    b_steps = [s.key for s in b_kind.steps(b_events)]
    note = None
    if a_kind.step_kinds != b_kind.step_kinds:  # agent actions beside calls: every row differs, and this says why
        note = (f"run {a_run.id} is {a_kind.label} and run {b_run.id} {b_kind.label}: their steps are of different "
                "kinds, so no row can pair up")
    return RunDiff(a_run.id, b_run.id, align(a_steps, b_steps), first, counts, prompt_change(a_events, b_events),
                   clock_first_steps(a_events, b_events), note)


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

    runs = {side: _check_readable(store, run_id) for side, run_id in (("a", run_a), ("b", run_b))}
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
                    if e.kind not in COMPARED:
                        continue
                    kind, site, value = e.kind, e.site, compared_value(e.kind, e.value)
                keyed.setdefault(KIND_LAYER[kind], {}).setdefault(site, {})[side] = value
            done += len(rows)
            if progress is not None:
                progress(done, total)
    first, counts = _first_per_layer(keyed)
    return _diff(runs["a"], runs["b"], events["a"], events["b"], first, counts)


def _check_readable(store, run_id: int):
    """The run, refused as `Store.load_run` refuses it before it reads an event: an unknown
    run, or a run (or a run it shares events with) whose row cannot be read."""
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
    return run


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
