"""The step tree: a run's timeline as one row per step, each expandable to its events.

`StepRows` maps the timeline's rows to events and back, over a `RunView` (windowed reads,
no textual). A collapsed step is one row that stands for the step (its first event); an
expanded step is one row per event of the step that the filter shows. Only the steps'
first events are read to open (one indexed read per step); an expanded step's events are
read when it is shown, so a run of 100k events opens and steps as fast as a short one.

The filter (`parse_filter`) names layers and kinds to show (`trace`, `token tool`) or to
hide (`-logits`); it applies inside expanded steps, never to the step rows themselves.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import accumulate

from tttr.app.runview import RunView
from tttr.sessions.vocabulary import KIND_LAYER, LAYERS, SETUP_STEP

FILTER_HELP = ("layers or kinds to show (trace, token tool), or to hide with - (-logits); "
               f"layers: {' '.join(LAYERS)}; kinds: {' '.join(KIND_LAYER)}; empty: show every event")
KEY_KINDS_READ = 8  # events read at each end of a collapsed step to summarise it


@dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events an expanded step shows: `show` (layers and kinds, empty: all) less `hide`."""

    show: frozenset[str] = frozenset()
    hide: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        known = set(LAYERS) | set(KIND_LAYER)
        for word in self.show | self.hide:
            if word not in known:
                raise ValueError(f"{word!r} is neither a layer nor a kind: {FILTER_HELP}")

    @property
    def active(self) -> bool:
        return bool(self.show or self.hide)

    def shows(self, event) -> bool:
        names = {event.layer, event.kind}
        if self.show and not names & self.show:
            return False
        return not names & self.hide

    def __str__(self) -> str:
        return " ".join(sorted(self.show) + [f"-{w}" for w in sorted(self.hide)])


NO_FILTER = EventFilter()


def parse_filter(text: str) -> EventFilter:
    """`trace`, `token tool`, `-logits`, `agent -prompt`: ValueError naming a word that is
    neither a layer nor a kind."""
    show, hide = set(), set()
    for word in text.replace(",", " ").lower().split():
        (hide if word.startswith("-") else show).add(word.lstrip("-+"))
    return EventFilter(frozenset(show), frozenset(hide - {""}))


@dataclass(frozen=True, slots=True)
class Row:
    """What one row of the step tree shows: a collapsed step (`seq` its first event) or
    one event of an expanded step."""

    step: int
    seq: int
    collapsed: bool


class StepRows:
    """The rows of the step tree of `view`'s run. Steps are found by their first events;
    a run whose steps are not in seq order (only a hand-made file) shows every event, flat."""

    def __init__(self, view: RunView) -> None:
        self.view = view
        self.filter = NO_FILTER
        self.expanded: set[int] = set()  # indexes into self.steps
        self._visible: dict[int, list[int]] = {}  # step index -> its seqs the filter shows
        self._representative: dict[int, int] = {}
        self._key_events: dict[int, list] = {}
        self.reload()

    # -- the steps -------------------------------------------------------------------------
    def reload(self) -> None:
        """(Re)read where the steps start (after the run grew)."""
        view = self.view
        every = bool(getattr(self, "steps", None)) and self.all_expanded  # then new steps open too
        steps, starts = [], []
        try:
            last = view.store.steps(view.run_id)
        except Exception:  # noqa: BLE001 - a store that cannot say: one flat step
            last = 0
        for step in [SETUP_STEP, *range(last)]:
            start = view.step_start(step)
            if start is not None:
                steps.append(step)
                starts.append(start)
        ordered = all(a < b for a, b in zip(starts, starts[1:]))
        if not steps or starts[0] != 0 or not ordered or starts[-1] >= max(1, view.count):
            # Not a step tree we can trust: every event, flat, as one expanded pseudo-step.
            first = view.event(0)
            steps, starts = [first.step if first is not None else 0], [0]
            self.flat = True
        else:
            self.flat = False
        self.steps, self.starts = steps, starts
        self.ends = starts[1:] + [view.count]
        self._visible.clear()
        self._representative.clear()
        self._key_events.clear()
        if self.flat:
            self.expanded = {0}
        elif every:
            self.expanded = set(range(len(steps)))
        else:
            self.expanded = {i for i in self.expanded if i < len(steps)}
        self._recount()

    def _recount(self) -> None:
        self._sizes = [self._rows_of(i) for i in range(len(self.steps))]
        self._offsets = [0, *accumulate(self._sizes)]

    def _rows_of(self, i: int) -> int:
        if i not in self.expanded:
            return 1
        return max(1, len(self.visible(i)) if self.filter.active else self.ends[i] - self.starts[i])

    def visible(self, i: int) -> list[int] | range:
        """The seqs of step `i` the filter shows (read once per step and filter)."""
        if not self.filter.active:
            return range(self.starts[i], self.ends[i])
        seqs = self._visible.get(i)
        if seqs is None:
            seqs = []
            for seq in range(self.starts[i], self.ends[i]):
                event = self.view.event(seq)
                if event is not None and self.filter.shows(event):
                    seqs.append(seq)
            self._visible[i] = seqs
        return seqs

    @property
    def count(self) -> int:
        """Rows in the tree."""
        return self._offsets[-1] if self.view.count else 0

    def index_of(self, seq: int) -> int:
        """The step index holding event `seq`."""
        return max(0, bisect.bisect_right(self.starts, seq) - 1)

    def row(self, number: int) -> Row | None:
        if not 0 <= number < self.count:
            return None
        i = bisect.bisect_right(self._offsets, number) - 1
        if i not in self.expanded:
            return Row(self.steps[i], self.representative(i), True)
        seqs = self.visible(i)
        k = number - self._offsets[i]
        if k >= len(seqs):  # an expanded step the filter hides whole: its row stands for it
            return Row(self.steps[i], self.representative(i), True)
        return Row(self.steps[i], seqs[k], False)

    def first_row(self, i: int) -> int:
        """The row where step `i` starts."""
        return self._offsets[i]

    def row_of(self, seq: int) -> int:
        """The row showing event `seq`: its step's row when collapsed, else its own row (an
        event the filter hides: the row of the one shown before it in its step)."""
        i = self.index_of(seq)
        if i not in self.expanded:
            return self._offsets[i]
        seqs = self.visible(i)
        k = bisect.bisect_right(seqs, seq) - 1
        return self._offsets[i] + max(0, min(k, self._sizes[i] - 1))

    def shown(self, seq: int) -> bool:
        """Whether event `seq` has a row of its own (its step expanded, the filter showing it)."""
        i = self.index_of(seq)
        if i not in self.expanded:
            return False
        seqs = self.visible(i)
        k = bisect.bisect_left(seqs, seq)
        return k < len(seqs) and seqs[k] == seq

    # -- changing what is shown ---------------------------------------------------------------
    def is_expanded(self, seq: int) -> bool:
        return self.index_of(seq) in self.expanded

    def expand(self, seq: int, open_: bool = True) -> bool:
        """Expand (or collapse) the step holding `seq`; True when that changed anything."""
        if self.flat:
            return False
        i = self.index_of(seq)
        if (i in self.expanded) == open_:
            return False
        (self.expanded.add if open_ else self.expanded.discard)(i)
        self._recount()
        return True

    def expand_all(self, open_: bool = True) -> None:
        if self.flat:
            return
        self.expanded = set(range(len(self.steps))) if open_ else set()
        self._recount()

    @property
    def all_expanded(self) -> bool:
        return len(self.expanded) == len(self.steps)

    def set_filter(self, event_filter: EventFilter) -> None:
        self.filter = event_filter
        self._visible.clear()
        self._recount()

    # -- what a collapsed step says ---------------------------------------------------------
    def key_events(self, i: int) -> list:
        """The events that say what step `i` did: everything but its prompt, tokens and
        logits (the model's action or call, the tool result, the clock reads, the outcome),
        read from the step's two ends only (two small reads, not the step's windows)."""
        found = self._key_events.get(i)
        if found is None:
            start, end = self.starts[i], self.ends[i]
            middle = min(end, start + KEY_KINDS_READ)
            events = self._read(start, middle) + self._read(max(middle, end - KEY_KINDS_READ), end)
            found = [e for e in events if e.kind not in ("prompt", "token", "logits")]
            self._key_events[i] = found
            while len(self._key_events) > 256:
                self._key_events.pop(next(iter(self._key_events)))
        return found

    def _read(self, start: int, stop: int) -> list:
        if start >= stop:
            return []
        try:
            return self.view.store.events(self.view.run_id, start, stop)
        except Exception:  # noqa: BLE001 - an unreadable event among them: through the view's stand-ins
            return [e for e in (self.view.event(seq) for seq in range(start, stop)) if e is not None]

    def events_in(self, i: int) -> int:
        """Events of step `i` (the number a collapsed row shows)."""
        return self.ends[i] - self.starts[i]

    def representative(self, i: int) -> int:
        """The event a collapsed step's row selects: what the step did (its outcome, else its
        tool result, action, setup or clock, else its first event), for the detail pane, `e`, `y`."""
        seq = self._representative.get(i)
        if seq is None:
            events = self.key_events(i)
            seq = self.starts[i]
            for kind in ("outcome", "tool", "action", "setup", "clock"):
                found = [e for e in events if e.kind == kind]
                if found:
                    seq = found[-1 if kind == "tool" else 0].seq
                    break
            self._representative[i] = seq
        return seq


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One step's time: tokens generated, and in ms (None where the step had no such part or
    it was not recorded) the model's time, the tool's time and the wait (`Store.step_times`).
    Where the run has no recorded timing, `tool_ms` is the command's duration as the sandbox
    measured it."""

    step: int
    tokens: int
    tool_ms: float | None
    command: str
    model_ms: float | None = None
    wait_ms: float | None = None


TIMING_LACKS = ("this run has no per-step timings (recorded before tttr stored them, or imported): shown are each "
                "command's duration and the step's token count for the model's share")


def timings_recorded(timings: list[StepTiming]) -> bool:
    """Whether the run's model time and wait were recorded (else only commands' durations are known)."""
    return any(t.model_ms is not None or t.wait_ms is not None for t in timings)


def step_timings(store, run_id: int) -> list[StepTiming]:
    """Per step, in order: its token count, its command, and what it took: the stored timing
    (`Store.step_times`), else the command's recorded duration. Counts are SQLite's (no value
    decoded) and only the tool results are read, so a 100k-event run costs a few queries."""
    tools: dict[int, tuple[float | None, str]] = {}
    for event in store.events(run_id, kind="tool"):
        value = event.value if isinstance(event.value, dict) else {}
        ms = value.get("duration_ms")
        ms = float(ms) if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None
        cmd = value.get("cmd") if isinstance(value.get("cmd"), str) else value.get("function")
        tools[event.step if isinstance(event.step, int) else SETUP_STEP] = (ms, cmd if isinstance(cmd, str) else "")
    tokens = store.step_counts(run_id, "token")
    timed = {t.step: t for t in store.step_times(run_id)}
    out = []
    for step in sorted(store.step_counts(run_id)):
        duration, command = tools.get(step, (None, ""))
        t = timed.get(step)
        if t is None:
            out.append(StepTiming(step, tokens.get(step, 0), None if timed else duration, command))
        else:
            out.append(StepTiming(step, tokens.get(step, 0), t.tool_ms, command, t.model_ms, t.wait_ms))
    return out
