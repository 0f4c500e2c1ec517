"""The timeline: a run as a step tree on one virtual widget.

It opens with one row per step (what the step did: its command and result, clock, outcome);
`space` expands a step to one line per event (tokens and logits included), `z` every step,
and `f`'s filter narrows expanded steps to layers and kinds (`StepRows`). Only the visible
lines are rendered, from events the `RunView` reads by window, so the widget costs the same
for a run of 100 events and one of 100k. An expanded step's events carry a bracket in the
gutter; each line its layer's letter and colour, and a bookmarked event a mark beside the
bracket. The border's subtitle says where the cursor is (`event 57/127 · step 1/2`: this
one's number out of the last's); a move with nowhere to go rings the bell and says so.
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
from tttr.app.steps import EventFilter, StepRows
from tttr.sessions.vocabulary import SETUP, SETUP_STEP

SITE_WIDTH = 15
BOOKMARK = "◆"
COLLAPSED, EXPANDED = "▸", "▾"


class Timeline(ScrollView, can_focus=True):
    """Cursor over the events of one run. Posts `EventSelected` when the cursor moves."""

    COMPONENT_CLASSES = {"timeline--cursor", "timeline--gutter", "timeline--fork", "timeline--bookmark"}

    BINDINGS = [
        Binding("down,j", "move(1)", "next row (a step, or an event of an expanded step)", show=False),
        Binding("up,k", "move(-1)", "previous row", show=False),
        Binding("right,]", "next_step", "next step", show=False),
        Binding("left,[", "prev_step", "prev step", show=False),
        Binding("full_stop", "next_of_layer", "next in layer", show=False),
        Binding("comma", "prev_of_layer", "prev in layer", show=False),
        Binding("l", "cycle_layer", "layer", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("home,g", "go_start", "start", show=False),
        Binding("end,G", "go_end", "end", show=False),
        Binding("space,enter", "toggle_step", "expand / collapse the step", show=False),
        Binding("z", "toggle_all", "expand / collapse every step", show=False),
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
        self.rows = StepRows(view)
        self._row_move = True  # the cursor moves by rows: it reveals no hidden event (nor does the first watch)
        self.bookmarks: set[int] = set() if bookmarks is None else bookmarks
        self._lines: OrderedDict[tuple[int, int], Strip] = OrderedDict()
        self._styles: dict[str, Style] = {}
        fork_seq = getattr(view.run, "fork_seq", None)
        self._fork_seq = fork_seq if getattr(view.run, "parent", None) is not None and fork_seq else None

    def on_mount(self) -> None:
        self.virtual_size = Size(0, self.rows.count)
        first = self.rows.row(0)
        if first is not None and self.cursor == 0:
            self._row_move = True
            self.cursor = first.seq  # the first step's row: what it did
        self.border_subtitle = self.position

    def reshape(self) -> None:
        """The rows changed (a step expanded, the filter, the run grew): lay them out again,
        keeping the cursor's row in view."""
        self.virtual_size = Size(0, self.rows.count)
        self.refresh()
        self.scroll_to_cursor()
        self.call_after_refresh(self.scroll_to_cursor)  # a scroll past the old height lands once it is laid out
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
        number = scroll_y + y
        width = self.size.width
        base = self._style("base")
        row = self.rows.row(number)
        if row is None:
            return Strip.blank(width, base)
        index = row.seq
        key = (index, row.collapsed, width)
        strip = self._lines.get(key)
        if strip is None:
            try:
                if row.collapsed:
                    strip = self._render_step(self.rows.index_of(index), width, base)
                else:
                    strip = self._render_event(index, width, base)
            except Exception as exc:  # noqa: BLE001 - an event no check foresaw is still one line
                line = Text(f"      ✗ unreadable event {index}: {describe.short(exc, 80)}", style="bold red",
                            no_wrap=True, end="")
                strip = Strip(list(line.render(self.app.console))).adjust_cell_length(width, base)
            self._lines[key] = strip
            while len(self._lines) > 512:
                self._lines.popitem(last=False)
        if number == self.rows.row_of(self.cursor):
            cursor = self._style("timeline--cursor")
            strip = Strip([Segment(t, (s or base) + cursor, c) for t, s, c in strip])
        return strip.apply_offsets(0, number)

    def _render_step(self, i: int, width: int, base: Style) -> Strip:
        """A collapsed step's row: what it did, from the events at its two ends."""
        rows = self.rows
        step = rows.steps[i]
        gutter_style = self._style("timeline--gutter")
        line = Text(no_wrap=True, end="", style=base)
        label = SETUP if step == SETUP_STEP else describe.short(step, 5)
        line.append(f"{label:>5}{COLLAPSED}", style=gutter_style)
        marked = any(rows.index_of(b) == i for b in self.bookmarks)
        line.append(BOOKMARK if marked else " ", style=self._style("timeline--bookmark") if marked else "")
        line.append_text(describe.step_line(rows.key_events(i)))
        line.append(f"  ({rows.events_in(i)} events)", style="dim")
        return Strip(list(line.render(self.app.console))).adjust_cell_length(width, base).simplify()

    def _render_event(self, index: int, width: int, base: Style) -> Strip:
        view = self.view
        event = view.event(index)
        if event is None:
            return Strip.blank(width, base)
        seqs = self.rows.visible(self.rows.index_of(index))  # the rows of its step: its bracket's
        first, last = not seqs or seqs[0] == index, not seqs or seqs[-1] == index
        gutter_style = self._style("timeline--gutter")
        line = Text(no_wrap=True, end="", style=base)
        step = SETUP if event.step < 0 else describe.short(event.step, 5)
        if index == self._fork_seq:
            line.append("    ⋔ ", style=self._style("timeline--fork"))
        elif first:
            line.append(f"{step:>5}", style=gutter_style).append(EXPANDED if not self.rows.flat else "┌" if not last
                                                                 else "─", style=gutter_style)
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
        y = self.rows.row_of(index) - scroll_y
        if 0 <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    def toggle_bookmark(self) -> bool:
        """Bookmark the event under the cursor, or drop its bookmark; True if now marked."""
        index = self.cursor
        self.bookmarks.symmetric_difference_update({index})
        self._lines = OrderedDict((k, v) for k, v in self._lines.items() if k[0] != index and not k[1])
        self.refresh_index(index)
        return index in self.bookmarks

    def forget(self) -> None:
        """Drop rendered lines (after the theme or the data changed)."""
        self._lines.clear()
        self.refresh()

    # -- cursor ------------------------------------------------------------------------
    def watch_cursor(self, old: int, new: int) -> None:
        if not self._row_move and not self.rows.shown(new) and self._reveal(new):
            self.reshape()
        self._row_move = False
        self.refresh_index(old)
        self.refresh_index(new)
        self.scroll_to_cursor()
        self.border_subtitle = self.position
        self.post_message(self.EventSelected(self, new))

    def _reveal(self, seq: int) -> bool:
        """The cursor was sent to event `seq` (go to, search, a layer's next event, a
        bookmark): expand its step, and drop a filter that hides it. True if the rows changed."""
        event = self.view.event(seq)
        rows = self.rows
        if self.rows.flat:
            changed = False
        elif not rows.is_expanded(seq) and seq == rows.representative(rows.index_of(seq)):
            return False  # the step's own row stands for it
        else:
            changed = rows.expand(seq)
        if event is not None and rows.filter.active and not rows.filter.shows(event):
            rows.set_filter(EventFilter())
            self.notify(f"filter off: event {seq} is a {describe.short(event.kind, 20)} event", timeout=3,
                        markup=False)
            changed = True
        return changed

    @property
    def position(self) -> str:
        """Where the cursor is: `event 57/127 · step 1/2` (the event's number, as `:` takes it,
        out of the last event's; its step's out of the last step's; `setup` before the first)."""
        event, last = self.view.event(self.cursor), self.view.event(self.view.count - 1)
        step = "?" if event is None else SETUP if event.step == SETUP_STEP else describe.short(event.step, 8)
        steps = last.step if last is not None and isinstance(last.step, int) and last.step >= 0 else SETUP
        return f"event {self.cursor}/{max(0, self.view.count - 1)} · step {step}/{steps}"

    @property
    def on_step_row(self) -> bool:
        """The cursor is on a collapsed step's row."""
        row = self.rows.row(self.rows.row_of(self.cursor))
        return row is not None and row.collapsed

    def on_resize(self) -> None:
        # The rows' height changes (the message strip grows or shrinks): keep the cursor in view.
        self.scroll_to_cursor()

    def validate_cursor(self, value: int) -> int:
        return max(0, min(value, max(0, self.view.count - 1)))

    def scroll_to_cursor(self) -> None:
        height = max(1, self.scrollable_content_region.height)
        _, top = self.scroll_offset
        row = self.rows.row_of(self.cursor)
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + height:
            self.scroll_to(y=row - height + 1, animate=False, immediate=True)

    def on_click(self, event) -> None:
        _, scroll_y = self.scroll_offset
        self.go_row(scroll_y + event.y)

    def go_to(self, index: int | None, nowhere: str = "nowhere to go from here") -> None:
        """Move the cursor to `index`; None (or where it already is): say `nowhere`."""
        if index is None or self.validate_cursor(index) == self.cursor:
            self.nowhere(nowhere)
            return
        self.cursor = index

    def go_row(self, number: int, nowhere: str = "nowhere to go from here") -> None:
        """Move the cursor to row `number` (what it shows is already on screen: nothing expands)."""
        row = self.rows.row(max(0, min(number, self.rows.count - 1)))
        if row is None or row.seq == self.cursor:
            self.nowhere(nowhere)
            return
        self._row_move = True
        self.cursor = row.seq

    def nowhere(self, why: str) -> None:
        """A move had nowhere to go: the bell, and a line saying why (not silence)."""
        self.app.bell()
        self.notify(why, severity="warning", timeout=2, markup=False)

    # -- actions -----------------------------------------------------------------------
    def action_move(self, delta: int) -> None:
        self.go_row(self.rows.row_of(self.cursor) + delta, "at the last row" if delta > 0 else "at the first row")

    def action_page(self, direction: int) -> None:
        self.go_row(self.rows.row_of(self.cursor) + direction * max(1, self.scrollable_content_region.height - 1),
                    "at the last row" if direction > 0 else "at the first row")

    def action_go_start(self) -> None:
        self.go_row(0, "at the first row")

    def action_go_end(self) -> None:
        self.go_row(self.rows.count - 1, "at the last row")

    def action_next_step(self) -> None:
        if self.rows.flat:
            self.go_to(self.view.next_step(self.cursor), "in the last step: no step after it")
            return
        i = self.rows.index_of(self.cursor) + 1
        if i >= len(self.rows.steps):
            self.nowhere("in the last step: no step after it")
            return
        self._go_step(i)

    def action_prev_step(self) -> None:
        if self.rows.flat:
            self.go_to(self.view.prev_step(self.cursor), "at the start of the first step")
            return
        rows = self.rows
        i = rows.index_of(self.cursor)
        first = rows.row(rows.first_row(i))
        if rows.is_expanded(self.cursor) and first is not None and first.seq < self.cursor:
            self.go_row(rows.first_row(i))
            return
        if i == 0:
            self.nowhere("at the start of the first step")
            return
        self._go_step(i - 1)

    def _go_step(self, i: int) -> None:
        """To step `i`'s first row: the step's own row when collapsed, else its first event."""
        self.go_row(self.rows.first_row(i))

    def go_to_step(self, seq: int) -> None:
        """To the step holding event `seq` (`:s3`, a compare's row): a collapsed step's row
        (nothing expands), else the step's first row."""
        self.go_row(self.rows.first_row(self.rows.index_of(seq)), "already at that step")

    def action_toggle_step(self) -> None:
        rows = self.rows
        if rows.flat:
            self.nowhere("this run's steps are not in order: every event is shown")
            return
        i = rows.index_of(self.cursor)
        rows.expand(self.cursor, not rows.is_expanded(self.cursor))
        self._row_move = True
        self.cursor = rows.row(rows.first_row(i)).seq
        self.reshape()

    def action_toggle_all(self) -> None:
        rows = self.rows
        if rows.flat:
            self.nowhere("this run's steps are not in order: every event is shown")
            return
        rows.expand_all(not rows.all_expanded)
        self._row_move = True
        self.cursor = rows.row(rows.row_of(self.cursor)).seq
        self.reshape()

    def set_filter(self, event_filter: EventFilter) -> None:
        """Show only what `event_filter` shows in expanded steps; the cursor stays on its row."""
        self.rows.set_filter(event_filter)
        self._lines.clear()
        self._row_move = True
        self.cursor = self.rows.row(self.rows.row_of(self.cursor)).seq
        self.reshape()

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
