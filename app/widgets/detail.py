"""The detail pane: everything recorded about the event under the cursor.

A Line-API widget: the renderable is laid out into lines once per cursor move, and the
pane only crops them, so following the cursor never triggers a screen layout (which
measures every widget) and a key press stays cheap.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.segment import Segment
from textual.binding import Binding
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip


class DetailPane(ScrollView, can_focus=True):
    """Shows one renderable; the screen sets it when the cursor moves. Tab focuses it,
    and the arrow and page keys then scroll it (ScrollView's bindings)."""

    BINDINGS = [
        Binding("down,j", "scroll_down", "scroll the detail down", show=False),
        Binding("up,k", "scroll_up", "scroll the detail up", show=False),
    ]

    def __init__(self, *, id=None, classes=None) -> None:
        super().__init__(id=id, classes=classes)
        self._renderable: RenderableType = ""
        self._lines: list[Strip] = []
        self._width = 0

    def show(self, renderable: RenderableType) -> None:
        self._renderable = renderable
        self._layout_lines()
        self.scroll_to(y=0, animate=False, immediate=True)
        self.refresh()

    def _layout_lines(self) -> None:
        width = max(10, self.scrollable_content_region.width)
        console = self.app.console
        options = console.options.update_width(width)
        base = self.rich_style
        lines = console.render_lines(self._renderable, options, style=base, pad=True)
        self._lines = [Strip(Segment.adjust_line_length(line, width, base), width) for line in lines]
        self._width = width
        self.virtual_size = Size(width, len(self._lines))

    def on_resize(self) -> None:
        if self.scrollable_content_region.width != self._width:
            self._layout_lines()
            self.refresh()

    def render_line(self, y: int) -> Strip:
        _, scroll_y = self.scroll_offset
        index = scroll_y + y
        if index < len(self._lines):
            return self._lines[index].apply_offsets(0, index)
        return Strip.blank(self.size.width, self.rich_style)

    @property
    def text(self) -> str:
        """What the pane shows, as plain text (for tests and screenshots' captions)."""
        return "\n".join(line.text.rstrip() for line in self._lines)
