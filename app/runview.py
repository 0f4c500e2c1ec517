"""One run as the app sees it: events read from the store by window, never all at once.

`RunView` is the app's only reader of a run's events. It keeps a few windows of events
in memory, and answers the questions the timeline asks on every key press (which event
is next in this layer, where does this step start, what did this step's message say)
with bounded reads, so that a run of 100k events opens and steps as fast as a run of
one hundred. It does not import textual: it is plain data access, usable from a script.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import replace
from typing import Any

from tttr.recorders.treestate import FileChange, diff_manifests
from tttr.sessions import values
from tttr.sessions.records import Event
from tttr.sessions.safe_text import visible
from tttr.sessions.vocabulary import LAYERS as VOCABULARY_LAYERS
from tttr.sessions.vocabulary import MUTABLE, site_parts

# Layer → (letter, colour). Letters make the timeline readable without colour:
# T tensor (logits), K token (sampling), R trace (the world: clock, tools), A agent (derived).
LAYERS: dict[str, tuple[str, str]] = {
    "tensor": ("T", "magenta"),
    "token": ("K", "cyan"),
    "trace": ("R", "yellow"),
    "agent": ("A", "green"),
}
LAYER_ORDER = VOCABULARY_LAYERS
EDITABLE_KINDS = MUTABLE

WINDOW = 256  # events per cached window
MAX_WINDOWS = 16  # windows kept; ~4k events, a few screens either side of the cursor
BLOB_PREVIEW = 64 * 1024  # bytes of a blob shown in the detail pane
STEP_PROBES = 64  # step numbers tried one by one before scanning across a gap
TOO_LARGE = "too large to show in full"


def is_blob(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("$blob"), str)


def value_problem(event) -> str | None:
    """Why `event`'s value cannot be shown as its kind, or None: the store's verdict, or for
    an event that did not come through the store's boundary, the store's rules applied here
    (one definition of what each kind's value must look like: `sessions.values`)."""
    problem = getattr(event, "problem", None)
    if problem:
        return str(problem)
    try:
        return values.check(event.kind, event.value)
    except Exception as exc:  # noqa: BLE001 - a value the rules cannot even inspect is unreadable
        return f"{type(exc).__name__}: {exc}"


def unreadable_event(run_id: int, seq: int, problem: str, near=None) -> Event:
    """A stand-in for an event the store could not read at all: it keeps its place in the
    timeline (step of its neighbour, no kind) and says why."""
    step = near.step if near is not None else -1
    return Event(run_id, seq, step, "?", "?", f"seq {seq}", None, None, problem)


def read_blob_text(store, ref: Any, limit: int = BLOB_PREVIEW) -> str:
    """A blob's first `limit` bytes as text; says so when the rest is not shown. Never
    raises: a missing, damaged or oversized blob reads as a line saying what is wrong.
    Only the first bytes are expanded (`get_blob_part`), so a small blob of a hostile
    file that expands to gigabytes costs no more than a small one."""
    digest = visible(ref.get("$blob", ""), newlines=False)[:12]
    try:
        if hasattr(store, "get_blob_part"):
            part = store.get_blob_part(ref["$blob"], limit)
            data, truncated, size = part.data, not part.complete, part.size
        else:
            data = store.get_blob(ref["$blob"])
            truncated, size = len(data) > limit, len(data)
    except MemoryError:
        return f"‹blob {digest}: {TOO_LARGE}›"
    except Exception as exc:  # noqa: BLE001 - a blob that does not read is shown, not raised
        message = visible(str(exc), newlines=False)
        if "too large" in message.lower() or "larger than" in message.lower():
            return f"‹blob {digest}: {TOO_LARGE} ({message})›"
        return f"‹blob {digest} unreadable: {message}›"
    text = bytes(data[:limit]).decode("utf-8", "replace")
    if truncated or len(data) > limit:
        if not isinstance(size, int) or isinstance(size, bool):
            size = ref.get("size")
        total = f"{size:,} bytes" if isinstance(size, int) and not isinstance(size, bool) else "more"
        text += f"\n… {TOO_LARGE}: the first {min(len(data), limit):,} bytes of {total}"
    return text


class RunView:
    """Windowed, cached access to one run of a store (called from the UI thread only)."""

    def __init__(self, store, run_id: int, *, defer_blobs: bool = False) -> None:
        self.store = store
        self.run = store.run(run_id)
        self.run_id = run_id
        self.count = store.count_events(run_id)
        self._windows: OrderedDict[int, list] = OrderedDict()
        self._step_starts: dict[int, int | None] = {}
        self._step_tokens: OrderedDict[int, list] = OrderedDict()
        self._sites: OrderedDict[str, Any] = OrderedDict()
        self._diffs: OrderedDict[str, list[FileChange] | None] = OrderedDict()
        # With defer_blobs (the app's UI thread), `text` and `files_changed` never read a
        # blob: they answer from what is loaded and list the rest in `wanted`, for a worker
        # to load with `load_wanted` on a connection of its own. A script reads directly.
        self.defer_blobs = defer_blobs
        self._blob_texts: OrderedDict[str, str] = OrderedDict()
        self.wanted: dict[str, Any] = {}  # key -> blob reference, or (before, after) of a diff

    def grow(self) -> bool:
        """Read the run's status and event count again, for a run still being recorded:
        True when either changed. What was read near the old end (the last window, steps
        and sites not found yet) is dropped, so that it is read again with the new events."""
        run = self.store.run(self.run_id)
        count = self.store.count_events(self.run_id)
        if count == self.count and run.status == self.run.status:
            return False
        self._windows.pop(self.count // WINDOW, None)
        self.run, self.count = run, count
        self._step_starts = {step: start for step, start in self._step_starts.items() if start is not None}
        self._step_tokens.clear()  # the last step's tokens may have grown
        self._sites = OrderedDict((site, e) for site, e in self._sites.items() if e is not None)
        return True

    # -- events by index (index == seq: a run's seqs are 0..count-1) ------------------
    def event(self, index: int):
        if not 0 <= index < self.count:
            return None
        window = self._window(index // WINDOW)
        offset = index - (index // WINDOW) * WINDOW
        return window[offset] if offset < len(window) else None

    def _window(self, number: int) -> list:
        window = self._windows.get(number)
        if window is None:
            start = number * WINDOW
            try:
                window = self.store.events(self.run_id, start, start + WINDOW)
            except Exception:  # noqa: BLE001 - one unreadable event must not hide its window
                window = self._one_by_one(start, min(start + WINDOW, self.count))
            self._windows[number] = window
            while len(self._windows) > MAX_WINDOWS:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(number)
        return window

    def _one_by_one(self, start: int, stop: int) -> list:
        """Events start..stop-1 read singly, an unreadable one replaced by a stand-in that
        says why (the store raised for it instead of marking it)."""
        out: list = []
        for seq in range(start, stop):
            try:
                out.extend(self.store.events(self.run_id, seq, seq + 1))
            except Exception as exc:  # noqa: BLE001 - shown as the event's problem
                out.append(unreadable_event(self.run_id, seq, _reason(exc), out[-1] if out else None))
        return out

    def _scan(self, indexes, match) -> int | None:
        """The first of `indexes` whose event satisfies `match`, read through the windows
        (the slow path, for when an indexed read fails on an unreadable event)."""
        for i in indexes:
            event = self.event(i)
            if event is not None and match(event):
                return i
        return None

    # -- navigation ----------------------------------------------------------------------
    def next_of_layer(self, index: int, layer: str) -> int | None:
        """The first event after `index` in `layer` (one indexed read)."""
        try:
            found = self.store.events(self.run_id, index + 1, None, layer=layer, limit=1)
        except Exception:  # noqa: BLE001 - an unreadable event on the way: scan instead
            return self._scan(range(index + 1, self.count), lambda e: e.layer == layer)
        return found[0].seq if found else None

    def prev_of_layer(self, index: int, layer: str) -> int | None:
        """The last event before `index` in `layer`: scans backwards in growing windows,
        so a nearby hit costs one small read and a far one a few."""
        stop, span = index, WINDOW
        while stop > 0:
            start = max(0, stop - span)
            try:
                found = self.store.events(self.run_id, start, stop, layer=layer)
            except Exception:  # noqa: BLE001 - an unreadable event on the way: scan instead
                return self._scan(range(stop - 1, -1, -1), lambda e: e.layer == layer)
            if found:
                return found[-1].seq
            stop, span = start, span * 4
        return None

    def step_start(self, step: int) -> int | None:
        if step not in self._step_starts:
            try:
                found = self.store.events(self.run_id, 0, None, step=step, limit=1)
                self._step_starts[step] = found[0].seq if found else None
            except Exception:  # noqa: BLE001 - an unreadable event on the way: scan instead
                self._step_starts[step] = self._scan(range(self.count), lambda e: e.step == step)
        return self._step_starts[step]

    def next_step(self, index: int) -> int | None:
        event = self.event(index)
        if event is None or not isinstance(event.step, int):
            return None
        last = self.event(self.count - 1)
        end = (last.step if last is not None and isinstance(last.step, int) else event.step) + 1
        probes = min(end, event.step + 1 + STEP_PROBES)
        for step in range(event.step + 1, probes):
            start = self.step_start(step)
            if start is not None:
                return start
        if probes >= end:
            return None
        # A wide gap in the step numbers (only a hand-made file has one): scan instead.
        return self._scan(range(index + 1, self.count), lambda e: _after(e.step, event.step))

    def prev_step(self, index: int) -> int | None:
        """The start of the current step, or of the one before when already there."""
        event = self.event(index)
        if event is None or not isinstance(event.step, int):
            return None
        start = self.step_start(event.step)
        if start is not None and start < index:
            return start
        lowest = max(-1, event.step - STEP_PROBES)
        for step in range(event.step - 1, lowest - 1, -1):
            start = self.step_start(step)
            if start is not None:
                return start
        if lowest <= -1:
            return None
        # A wide gap in the step numbers: scan back to the step before, then to its start.
        found = self._scan(range(index - 1, -1, -1), lambda e: _after(event.step, e.step))
        if found is None:
            return None
        step = self.event(found).step
        while found > 0 and self.event(found - 1) is not None and self.event(found - 1).step == step:
            found -= 1
        return found

    # -- what the detail pane and the message strip need ----------------------------------
    def at(self, site: str):
        if site not in self._sites:
            try:
                self._sites[site] = self.store.event_at(self.run_id, site)
            except Exception as exc:  # noqa: BLE001 - shown as the event's problem
                self._sites[site] = Event(self.run_id, -1, -1, "?", "?", site, None, None, _reason(exc))
            while len(self._sites) > 512:
                self._sites.popitem(last=False)
        return self._sites[site]

    def step_tokens(self, step: int) -> list:
        tokens = self._step_tokens.get(step)
        if tokens is None:
            try:
                tokens = self.store.events(self.run_id, 0, None, step=step, kind="token")
            except Exception:  # noqa: BLE001 - a step with an unreadable token shows none
                tokens = []
            self._step_tokens[step] = tokens
            while len(self._step_tokens) > 8:
                self._step_tokens.popitem(last=False)
        return tokens

    def logits_for(self, token_event):
        pos = token_pos(token_event)
        return None if pos is None else self.at(f"{token_event.step}:logits:{pos}")

    def token_for(self, logits_event):
        pos = token_pos(logits_event)
        return None if pos is None else self.at(f"{logits_event.step}:token:{pos}")

    def text(self, value: Any, limit: int = BLOB_PREVIEW) -> str:
        """A field of an event's value as text, with a blob read from the store (or, with
        defer_blobs, a placeholder until a worker has loaded it)."""
        if value is None:
            return ""
        if is_blob(value):
            digest = value["$blob"]
            text = self._blob_texts.get(digest)
            if text is not None:
                self._blob_texts.move_to_end(digest)
                return text
            if self.defer_blobs:
                self.wanted[digest] = value
                size = value.get("size")
                return f"‹loading blob {visible(digest, newlines=False)[:12]}" + (
                    f" ({size} bytes)" if isinstance(size, int) else "") + " …›"
            return self._keep_text(digest, read_blob_text(self.store, value, limit))
        if isinstance(value, str):
            return value
        try:
            return json.dumps(value)
        except (TypeError, ValueError, RecursionError):
            return f"‹{type(value).__name__} that cannot be shown›"

    def loaded_text(self, value: Any) -> str | None:
        """A blob's text if it is loaded (None while it is not); any other value as `text`."""
        return self._blob_texts.get(value["$blob"]) if is_blob(value) else self.text(value)

    def _keep_text(self, digest: str, text: str) -> str:
        self._blob_texts[digest] = text
        while len(self._blob_texts) > 16:
            self._blob_texts.popitem(last=False)
        return text

    def take_wanted(self) -> dict[str, Any]:
        """What `text` and `files_changed` deferred since the last call, for a worker."""
        wanted, self.wanted = self.wanted, {}
        return wanted

    def merge_loaded(self, loaded: dict[str, Any]) -> None:
        """Keep what `load_wanted` read (on the thread that owns this view)."""
        for key, result in loaded.items():
            if isinstance(result, str):
                self._keep_text(key, result)
            else:
                self._diffs[key] = result

    def files_changed(self, tool_event) -> list[FileChange] | None:
        """Files this command changed: the trace recorder's diff of the snapshots before
        and after it. None when the run holds no snapshot to compare, LOADING while a
        worker reads it."""
        value = tool_event.value if isinstance(tool_event.value, dict) else {}
        before, after = value.get("tree_before"), value.get("tree_after")
        if before and before == after:
            return []
        snapshot = value.get("snapshot")
        if not snapshot or not isinstance(snapshot, str):
            return None
        try:
            if not (isinstance(before, str) and before and self.store.has_blob(before)):
                before = self._snapshot_before(tool_event)
        except Exception:  # noqa: BLE001 - a store that cannot answer: no diff to show
            return None
        key = f"{before}>{snapshot}"
        if key not in self._diffs:
            if self.defer_blobs:
                self.wanted[key] = (before, snapshot)
                return LOADING
            self._diffs[key] = _diff_trees(self.store, before, snapshot)
        while len(self._diffs) > 32:
            self._diffs.popitem(last=False)
        return self._diffs[key]

    def _snapshot_before(self, tool_event) -> str | None:
        for step in range(tool_event.step - 1, -2, -1):
            for site in (f"{step}:tool", f"{step}:setup"):
                event = self.at(site)
                if event is not None and isinstance(event.value, dict) and isinstance(event.value.get("snapshot"), str):
                    return event.value["snapshot"]
        return None


LOADING: list[FileChange] = []  # the files_changed answer while a worker reads the snapshots


def load_wanted(store, wanted: dict[str, Any]) -> dict[str, Any]:
    """Read what a deferring RunView wanted (blob texts, snapshot diffs) through `store`,
    a connection of the calling thread; hand the result to `RunView.merge_loaded`."""
    loaded: dict[str, Any] = {}
    for key, what in wanted.items():
        loaded[key] = _diff_trees(store, *what) if isinstance(what, tuple) else read_blob_text(store, what)
    return loaded


def _after(step, other) -> bool:
    """`step` comes after `other` (a step that is not a number comes after none)."""
    return isinstance(step, int) and isinstance(other, int) and step > other


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, RecursionError):
        text = "nested too deeply to read"
    return visible(text, newlines=False)


def token_pos(event) -> int | None:
    parts = site_parts(event.site) if isinstance(event.site, str) else None
    return parts[2] if parts is not None else None


def _diff_trees(store, before: str | None, after: str) -> list[FileChange] | None:
    try:
        # the trace layer owns the manifest format; a file's name is the program's: shown, never obeyed
        return [replace(c, path=visible(c.path, newlines=False)) for c in diff_manifests(store, before, after)]
    except Exception:  # noqa: BLE001 - a manifest that does not read shows as "unknown"
        return None