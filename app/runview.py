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
from dataclasses import dataclass
from typing import Any

# Layer → (letter, colour). Letters make the timeline readable without colour:
# T tensor (logits), K token (sampling), R trace (the world: clock, tools), A agent (derived).
LAYERS: dict[str, tuple[str, str]] = {
    "tensor": ("T", "magenta"),
    "token": ("K", "cyan"),
    "trace": ("R", "yellow"),
    "agent": ("A", "green"),
}
LAYER_ORDER = ("tensor", "token", "trace", "agent")
EDITABLE_KINDS = ("clock", "tool", "token")

WINDOW = 256  # events per cached window
MAX_WINDOWS = 16  # windows kept; ~4k events, a few screens either side of the cursor
BLOB_PREVIEW = 64 * 1024  # bytes of a blob shown in the detail pane


def is_blob(value: Any) -> bool:
    return isinstance(value, dict) and "$blob" in value


@dataclass(frozen=True, slots=True)
class FileChange:
    path: str
    change: str  # "added" | "removed" | "modified"


class RunView:
    """Windowed, cached access to one run of a store (called from the UI thread only)."""

    def __init__(self, store, run_id: int) -> None:
        self.store = store
        self.run = store.run(run_id)
        self.run_id = run_id
        self.count = store.count_events(run_id)
        self._windows: OrderedDict[int, list] = OrderedDict()
        self._step_starts: dict[int, int | None] = {}
        self._step_tokens: OrderedDict[int, list] = OrderedDict()
        self._sites: OrderedDict[str, Any] = OrderedDict()
        self._diffs: OrderedDict[str, list[FileChange] | None] = OrderedDict()

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
            window = self.store.events(self.run_id, start, start + WINDOW)
            self._windows[number] = window
            while len(self._windows) > MAX_WINDOWS:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(number)
        return window

    # -- navigation ----------------------------------------------------------------------
    def next_of_layer(self, index: int, layer: str) -> int | None:
        """The first event after `index` in `layer` (one indexed read)."""
        found = self.store.events(self.run_id, index + 1, None, layer=layer, limit=1)
        return found[0].seq if found else None

    def prev_of_layer(self, index: int, layer: str) -> int | None:
        """The last event before `index` in `layer`: scans backwards in growing windows,
        so a nearby hit costs one small read and a far one a few."""
        stop, span = index, WINDOW
        while stop > 0:
            start = max(0, stop - span)
            found = self.store.events(self.run_id, start, stop, layer=layer)
            if found:
                return found[-1].seq
            stop, span = start, span * 4
        return None

    def step_start(self, step: int) -> int | None:
        if step not in self._step_starts:
            found = self.store.events(self.run_id, 0, None, step=step, limit=1)
            self._step_starts[step] = found[0].seq if found else None
        return self._step_starts[step]

    def next_step(self, index: int) -> int | None:
        event = self.event(index)
        if event is None:
            return None
        last = self.event(self.count - 1)
        for step in range(event.step + 1, (last.step if last else event.step) + 1):
            start = self.step_start(step)
            if start is not None:
                return start
        return None

    def prev_step(self, index: int) -> int | None:
        """The start of the current step, or of the one before when already there."""
        event = self.event(index)
        if event is None:
            return None
        start = self.step_start(event.step)
        if start is not None and start < index:
            return start
        for step in range(event.step - 1, -2, -1):
            start = self.step_start(step)
            if start is not None:
                return start
        return None

    # -- what the detail pane and the message strip need ----------------------------------
    def at(self, site: str):
        if site not in self._sites:
            self._sites[site] = self.store.event_at(self.run_id, site)
            while len(self._sites) > 512:
                self._sites.popitem(last=False)
        return self._sites[site]

    def step_tokens(self, step: int) -> list:
        tokens = self._step_tokens.get(step)
        if tokens is None:
            tokens = self.store.events(self.run_id, 0, None, step=step, kind="token")
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
        """A field of an event's value as text, with a blob read from the store."""
        if value is None:
            return ""
        if is_blob(value):
            try:
                data = self.store.get_blob(value["$blob"])
            except Exception as exc:  # noqa: BLE001 - a missing blob is shown, not raised
                return f"<blob {value['$blob'][:12]} unreadable: {exc}>"
            text = data[:limit].decode("utf-8", "replace")
            if len(data) > limit:
                text += f"\n… ({len(data) - limit} more bytes)"
            return text
        return value if isinstance(value, str) else json.dumps(value)

    def files_changed(self, tool_event) -> list[FileChange] | None:
        """Files this command changed: the trace recorder's diff of the snapshots before
        and after it. None when the run holds no snapshot to compare."""
        value = tool_event.value if isinstance(tool_event.value, dict) else {}
        before, after = value.get("tree_before"), value.get("tree_after")
        if before and before == after:
            return []
        snapshot = value.get("snapshot")
        if not snapshot:
            return None
        if not (before and self.store.has_blob(before)):
            before = self._snapshot_before(tool_event)
        key = f"{before}>{snapshot}"
        if key not in self._diffs:
            self._diffs[key] = _diff_trees(self.store, before, snapshot)
            while len(self._diffs) > 32:
                self._diffs.popitem(last=False)
        return self._diffs[key]

    def _snapshot_before(self, tool_event) -> str | None:
        for step in range(tool_event.step - 1, -2, -1):
            for site in (f"{step}:tool", f"{step}:setup"):
                event = self.at(site)
                if event is not None and isinstance(event.value, dict) and event.value.get("snapshot"):
                    return event.value["snapshot"]
        return None


def token_pos(event) -> int | None:
    parts = event.site.split(":")
    return int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else None


def _diff_trees(store, before: str | None, after: str) -> list[FileChange] | None:
    from recorders.snapshot import diff_trees  # the trace layer owns the manifest format

    try:
        diff = diff_trees(before, after, store)
    except Exception:  # noqa: BLE001 - a manifest that does not read shows as "unknown"
        return None
    names = {"added": "added", "removed": "removed", "changed": "modified"}
    return sorted((FileChange(p, names[k]) for k in names for p in diff.get(k, [])), key=lambda c: c.path)
