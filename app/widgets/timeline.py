"""The timeline: every event of a run on one virtual widget, one line per event.

Only the visible lines are rendered, from events the `RunView` reads by window, so the
widget costs the same for a run of 100 events and one of 100k. Events are grouped by
step with a bracket in the gutter; each line carries its layer's letter and colour, and a
bookmarked event a mark beside the bracket. The border's subtitle says where the cursor
is (`event 57/128 · step 1/3`); a move with nowhere to go rings the bell and says so.
"""

from __future__ import annotations

from collections import OrderedDict

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tttr.app import describe
from tttr.app.runview import LAYER_ORDER, LAYERS, RunView
from tttr.sessions.vocabulary import SETUP, SETUP_STEP

SITE_WIDTH = 15
BOOKMARK = "◆"


class Timeline(ScrollView, can_focus=True):
    """Cursor over the events of one run. Posts `EventSelected` when the cursor moves."""

    COMPONENT_CLASSES = {"timeline--cursor", "timeline--gutter", "timeline--fork", "timeline--bookmark"}

    BINDINGS = [
        Binding("down,j", "move(1)", "next event", show=False),
        Binding("up,k", "move(-1)", "prev event", show=False),
        Binding("right,]", "next_step", "next step", show=False),
        Binding("left,[", "prev_step", "prev step", show=False),
        Binding("full_stop", "next_of_layer", "next in layer", show=False),
        Binding("comma", "prev_of_layer", "prev in layer", show=False),
        Binding("l", "cycle_layer", "layer", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("home,g", "go_start", "start", show=False),
        Binding("end,G", "go_end", "end", show=False),
    ]

    cursor: reactive[int] = reactive(0, always_update=True, repaint=False)
    chosen_layer: reactive[str] = reactive("token")

    class EventSelected(Message):
        """The cursor is on event `index` of the run."""

        def __init__(self, timeline: "Timeline", index: int) -> None:
            super().__init__()
            self.timeline = timeline
            self.index = index

        @property
        def control(self) -> "Timeline":
            return self.timeline

    def __init__(self, view: RunView, *, bookmarks: set[int] | None = None, name=None, id=None,
                 classes=None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.view = view
        self.bookmarks: set[int] = set() if bookmarks is None else bookmarks
        self._lines: OrderedDict[tuple[int, int], Strip] = OrderedDict()
        self._styles: dict[str, Style] = {}
        fork_seq = getattr(view.run, "fork_seq", None)
        self._fork_seq = fork_seq if getattr(view.run, "parent", None) is not None and fork_seq else None

    def on_mount(self) -> None:
        self.virtual_size = Size(0, self.view.count)
        self.border_subtitle = self.position

    # -- rendering -------------------------------------------------------------------
    def _style(self, name: str) -> Style:
        """A component's style, looked up once per theme (every visible line needs them)."""
        style = self._styles.get(name)
        if style is None:
            style = self.rich_style if name == "base" else self.get_component_rich_style(name, partial=True)
            self._styles[name] = style
        return style

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()
        self._lines.clear()

    def render_line(self, y: int) -> Strip:
        _, scroll_y = self.scroll_offset
        index = scroll_y + y
        width = self.size.width
        base = self._style("base")
        if index >= self.view.count:
            return Strip.blank(width, base)
        key = (index, width)
        strip = self._lines.get(key)
        if strip is None:
            try:
                strip = self._render_event(index, width, base)
            except Exception as exc:  # noqa: BLE001 - an event no check foresaw is still one line
                line = Text(f"      ✗ unreadable event {index}: {describe.short(exc, 80)}", style="bold red",
                            no_wrap=True, end="")
                strip = Strip(list(line.render(self.app.console))).adjust_cell_length(width, base)
            self._lines[key] = strip
            while len(self._lines) > 512:
                self._lines.popitem(last=False)
        if index == self.cursor:
            cursor = self._style("timeline--cursor")
            strip = Strip([Segment(t, (s or base) + cursor, c) for t, s, c in strip])
        return strip.apply_offsets(0, index)

    def _render_event(self, index: int, width: int, base: Style) -> Strip:
        view = self.view
        event = view.event(index)
        if event is None:
            return Strip.blank(width, base)
        before, after = view.event(index - 1), view.event(index + 1)
        first = before is None or before.step != event.step
        last = after is None or after.step != event.step
        gutter_style = self._style("timeline--gutter")
        line = Text(no_wrap=True, end="", style=base)
        step = SETUP if event.step < 0 else describe.short(event.step, 5)
        if index == self._fork_seq:
            line.append("    ⋔ ", style=self._style("timeline--fork"))
        elif first:
            line.append(f"{step:>5}", style=gutter_style).append("┌" if not last else "─", style=gutter_style)
        else:
            line.append("     " + ("└" if last else "│"), style=gutter_style)
        if index in self.bookmarks:
            line.append(BOOKMARK, style=self._style("timeline--bookmark"))
        else:
            line.append(" ")
        line.append_text(describe.layer_tag(event.layer))
        line.append(" ")
        colour = LAYERS.get(event.layer, ("", "white"))[1]
        line.append(f"{describe.short(event.site, SITE_WIDTH + 2):<{SITE_WIDTH}}", style=f"dim {colour}")
        line.append(" ")
        line.append_text(describe.summary(event))
        segments = list(line.render(self.app.console))
        return Strip(segments).adjust_cell_length(width, base).simplify()

    def refresh_index(self, index: int) -> None:
        _, scroll_y = self.scroll_offset
        y = index - scroll_y
        if 0 <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    def toggle_bookmark(self) -> bool:
        """Bookmark the event under the cursor, or drop its bookmark; True if now marked."""
        index = self.cursor
        self.bookmarks.symmetric_difference_update({index})
        self._lines = OrderedDict((k, v) for k, v in self._lines.items() if k[0] != index)
        self.refresh_index(index)
        return index in self.bookmarks

    def forget(self) -> None:
        """Drop rendered lines (after the theme or the data changed)."""
        self._lines.clear()
        self.refresh()

    # -- cursor ------------------------------------------------------------------------
    def watch_cursor(self, old: int, new: int) -> None:
        self.refresh_index(old)
        self.refresh_index(new)
        self.scroll_to_cursor()
        self.border_subtitle = self.position
        self.post_message(self.EventSelected(self, new))

    @property
    def position(self) -> str:
        """Where the cursor is: `event 57/128 · step 1/3` (a seq of the run's events, a
        step number of its steps; `setup` before the first step)."""
        event, last = self.view.event(self.cursor), self.view.event(self.view.count - 1)
        step = "?" if event is None else SETUP if event.step == SETUP_STEP else describe.short(event.step, 8)
        steps = last.step + 1 if last is not None and isinstance(last.step, int) and last.step >= 0 else 0
        return f"event {self.cursor}/{self.view.count} · step {step}/{steps}"

    def on_resize(self) -> None:
        # The rows' height changes (the message strip grows or shrinks): keep the cursor in view.
        self.scroll_to_cursor()

    def validate_cursor(self, value: int) -> int:
        return max(0, min(value, max(0, self.view.count - 1)))

    def scroll_to_cursor(self) -> None:
        height = max(1, self.scrollable_content_region.height)
        _, top = self.scroll_offset
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False, immediate=True)
        elif self.cursor >= top + height:
            self.scroll_to(y=self.cursor - height + 1, animate=False, immediate=True)

    def on_click(self, event) -> None:
        _, scroll_y = self.scroll_offset
        self.cursor = scroll_y + event.y

    def go_to(self, index: int | None, nowhere: str = "nowhere to go from here") -> None:
        """Move the cursor to `index`; None (or where it already is): say `nowhere`."""
        if index is None or self.validate_cursor(index) == self.cursor:
            self.nowhere(nowhere)
            return
        self.cursor = index

    def nowhere(self, why: str) -> None:
        """A move had nowhere to go: the bell, and a line saying why (not silence)."""
        self.app.bell()
        self.notify(why, severity="warning", timeout=2, markup=False)

    # -- actions -----------------------------------------------------------------------
    def action_move(self, delta: int) -> None:
        self.go_to(self.cursor + delta, "at the last event" if delta > 0 else "at the first event")

    def action_page(self, direction: int) -> None:
        self.go_to(self.cursor + direction * max(1, self.scrollable_content_region.height - 1),
                   "at the last event" if direction > 0 else "at the first event")

    def action_go_start(self) -> None:
        self.go_to(0, "at the first event")

    def action_go_end(self) -> None:
        self.go_to(self.view.count - 1, "at the last event")

    def action_next_step(self) -> None:
        self.go_to(self.view.next_step(self.cursor), "in the last step: no step after it")

    def action_prev_step(self) -> None:
        self.go_to(self.view.prev_step(self.cursor), "at the start of the first step")

    def action_next_of_layer(self) -> None:
        self.go_to(self.view.next_of_layer(self.cursor, self.chosen_layer),
                   f"no {self.chosen_layer} event after this one (l chooses another layer)")

    def action_prev_of_layer(self) -> None:
        self.go_to(self.view.prev_of_layer(self.cursor, self.chosen_layer),
                   f"no {self.chosen_layer} event before this one (l chooses another layer)")

    def action_cycle_layer(self) -> None:
        self.chosen_layer = LAYER_ORDER[(LAYER_ORDER.index(self.chosen_layer) + 1) % len(LAYER_ORDER)]

    def watch_chosen_layer(self, layer: str) -> None:
        letter, colour = LAYERS[layer]
        self.border_title = Text.assemble(("→ ← ", "bold"), "step  ", (", . ", "bold"),
                                          (f"{letter} {layer}", f"bold {colour}"), "  ", ("l", "bold"), " layer")
