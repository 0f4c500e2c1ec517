"""Two runs side by side, aligned by step, on one virtual widget: one scroll moves both.

Each aligned row takes two lines: the action, then its exit code and first line of
output; the setup's row (when either run has one), its clock, then its tree. The fork site carries ⋔, every divergent row is tinted (≠), and the first
divergence is marked ▶ and tinted strongest.

Under it, `MessagePair` shows the messages of the row under the cursor side by side, token
by token, each token that is not in the other run's message marked.
"""

from __future__ import annotations

from itertools import groupby

from rich.segment import Segment
from rich.text import Text
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tttr.app import describe
from tttr.app.compare import Comparison, CompareRow, MessageDiff, StepInfo
from tttr.app.widgets.detail import DetailPane
from tttr.sessions.safe_text import visible

LINES_PER_ROW = 2
GUTTER = 3


class SideBySide(ScrollView, can_focus=True):
    COMPONENT_CLASSES = {"sbs--cursor", "sbs--cursor-tinted", "sbs--differ", "sbs--first", "sbs--fork", "sbs--divider"}

    BINDINGS = [
        Binding("down,j", "move(1)", "next row", show=False),
        Binding("up,k", "move(-1)", "prev row", show=False),
        Binding("n", "next_difference", "next difference"),
        Binding("p", "prev_difference", "prev difference"),
        Binding("home,g", "move_to(0)", "first", show=False),
        Binding("end,G", "move_to(-1)", "last", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("pageup", "page(-1)", show=False),
    ]

    cursor: reactive[int] = reactive(0, repaint=False)

    class RowSelected(Message):
        def __init__(self, row: CompareRow | None) -> None:
            super().__init__()
            self.row = row

    def __init__(self, *, id=None, classes=None) -> None:
        super().__init__(id=id, classes=classes)
        self.comparison: Comparison | None = None

    def show(self, comparison: Comparison) -> None:
        self.comparison = comparison
        self.virtual_size = Size(0, len(comparison.rows) * LINES_PER_ROW)
        first = next((i for i, r in enumerate(comparison.rows) if r.first_divergence), 0)
        self.cursor = first
        self.refresh()

    @property
    def rows(self) -> list[CompareRow]:
        return self.comparison.rows if self.comparison else []

    # -- rendering --------------------------------------------------------------------
    def render_line(self, y: int) -> Strip:
        _, scroll_y = self.scroll_offset
        line_no = scroll_y + y
        index, sub = divmod(line_no, LINES_PER_ROW)
        width = self.scrollable_content_region.width  # not under the scrollbar: the right half ends in view
        base = self.rich_style
        if index >= len(self.rows):
            return Strip.blank(width, base)
        row = self.rows[index]
        tint = None
        if row.first_divergence:
            tint = self.get_component_rich_style("sbs--first", partial=True)
        elif not row.same:
            tint = self.get_component_rich_style("sbs--differ", partial=True)
        if index == self.cursor:
            if tint is None:
                tint = self.get_component_rich_style("sbs--cursor", partial=True)
            elif sub == 0:  # a tinted row keeps its tint; the cursor marks its first line
                tint = tint + self.get_component_rich_style("sbs--cursor-tinted", partial=True)
        half = max(10, (width - GUTTER - 1) // 2)
        line = Text(no_wrap=True, end="", style=base)
        if sub == 0:
            fork_style = self.get_component_rich_style("sbs--fork", partial=True)
            line.append("⋔" if row.fork else " ", style=fork_style)
            line.append("▶" if row.first_divergence else "≠" if not row.same else " ", style="bold")
            line.append(" ")
        else:
            line.append("   ")
        line.append_text(self._side(row.a, sub, half))
        line.append("┃", style=self.get_component_rich_style("sbs--divider", partial=True))
        line.append_text(self._side(row.b, sub, half))
        strip = Strip(list(line.render(self.app.console))).adjust_cell_length(width, base)
        if tint is not None:
            strip = Strip([Segment(t, (s or base) + tint, c) for t, s, c in strip])
        return strip.apply_offsets(0, line_no)

    @staticmethod
    def _side(info: StepInfo | None, sub: int, width: int) -> Text:
        if info is None:
            text = Text("   —  (no step)" if sub == 0 else "", style="dim")
        elif info.step < 0:  # the setup: its clock, then its tree
            if sub == 0:
                text = Text("setup ", style="bold")
                if info.problem is not None:
                    text.append_text(describe.unreadable_label(describe.short(info.problem, width)))
                else:
                    text.append("clock " + describe.short(info.action or "not recorded", width), style="yellow")
            else:
                text = Text("      " + describe.short(info.output, width), style="dim")
        elif sub == 0:
            text = Text(f"{describe.short(info.step, 6):>4} ", style="bold")
            if info.problem is not None:
                text.append_text(describe.unreadable_label(describe.short(info.problem, width)))
            elif info.action == "done":
                text.append("done", style="bold green")
            elif info.command:
                text.append_text(describe.highlight_bash("$ " + describe.short(info.action, width)))
            else:
                text.append_text(describe.safe(describe.short(info.action, width)))
        else:
            text = Text("       ")
            if info.tool_problem is not None:
                text.append_text(describe.unreadable_label(describe.short(info.tool_problem, width)))
            elif info.exit_code is not None:
                colour = "green" if info.exit_code == 0 else "red"
                text.append(f"exit {describe.short(info.exit_code, 12)} ", style=colour)
            text.append(describe.short(info.output, width), style="dim")
        text.truncate(width, overflow="ellipsis", pad=True)
        return text

    # -- cursor ----------------------------------------------------------------------
    def validate_cursor(self, value: int) -> int:
        return max(0, min(value, len(self.rows) - 1)) if self.rows else 0

    def watch_cursor(self, old: int, new: int) -> None:
        _, top = self.scroll_offset
        for index in (old, new):
            y = index * LINES_PER_ROW - top
            self.refresh(Region(0, y, self.size.width, LINES_PER_ROW))
        height = max(LINES_PER_ROW, self.scrollable_content_region.height)
        y = new * LINES_PER_ROW
        if y < top:
            self.scroll_to(y=y, animate=False, immediate=True)
        elif y + LINES_PER_ROW > top + height:
            self.scroll_to(y=y + LINES_PER_ROW - height, animate=False, immediate=True)
        self.post_message(self.RowSelected(self.rows[new] if self.rows else None))

    def on_click(self, event) -> None:
        _, top = self.scroll_offset
        self.cursor = (top + event.y) // LINES_PER_ROW

    def action_move(self, delta: int) -> None:
        self.cursor += delta

    def action_move_to(self, index: int) -> None:
        self.cursor = index if index >= 0 else len(self.rows) - 1

    def action_page(self, direction: int) -> None:
        self.cursor += direction * max(1, self.scrollable_content_region.height // LINES_PER_ROW - 1)

    def action_next_difference(self) -> None:
        hit = next((i for i in range(self.cursor + 1, len(self.rows)) if not self.rows[i].same), None)
        self.cursor = hit if hit is not None else self.cursor

    def action_prev_difference(self) -> None:
        hit = next((i for i in range(self.cursor - 1, -1, -1) if not self.rows[i].same), None)
        self.cursor = hit if hit is not None else self.cursor


class MessagePair(DetailPane):
    """The two messages of one aligned row, side by side; the tokens that differ are marked.
    A Line-API pane of a fixed height: laid out once per row, so moving the cursor never
    lays out the screen."""

    COMPONENT_CLASSES = {"message-pair--differs", "message-pair--divider"}

    def show(self, diff: MessageDiff | None, row: CompareRow | None) -> None:
        if diff is None or row is None:
            super().show(Text("no message on this row" + (" (the setup)" if row is not None else ""), style="dim"))
            return
        marked = self.get_component_rich_style("message-pair--differs", partial=True)
        divider = self.get_component_rich_style("message-pair--divider", partial=True)
        heads = [self._head(info, tokens, marks) for info, tokens, marks in
                 ((row.a, diff.a, diff.a_marks), (row.b, diff.b, diff.b_marks))]
        bodies = [self._tokens(diff.a, diff.a_marks, marked), self._tokens(diff.b, diff.b_marks, marked)]
        super().show(_Columns(heads, bodies, divider))

    @staticmethod
    def _head(info: StepInfo | None, tokens: tuple[str, ...], marks: tuple[bool, ...]) -> Text:
        if info is None:
            return Text("— (no step)", style="dim")
        text = Text(f"message of step {describe.short(info.step, 8)}", style="bold")
        if tokens:
            text.append(f" · {sum(marks)} of {len(tokens)} tokens differ", style="dim")
        return text

    @staticmethod
    def _tokens(tokens: tuple[str, ...], marks: tuple[bool, ...], marked) -> Text:
        if not tokens:
            return Text("(no message)", style="dim")
        text = Text()
        for differs, run in groupby(zip(tokens, marks), key=lambda pair: pair[1]):
            shown = "".join(token for token, _ in run)
            if differs and not shown.strip():  # whitespace that differs, made visible
                shown = shown.replace(" ", "·").replace("\t", "→").replace("\n", "⏎\n")
            text.append(visible(shown), style=marked if differs else "")
        return text


class _Columns:
    """Two texts in two columns of the width they are drawn at, each wrapped on its own and
    joined line by line (a rich Table does the same at several times the cost per key)."""

    def __init__(self, heads: list[Text], bodies: list[Text], divider) -> None:
        self.heads, self.bodies, self.divider = heads, bodies, divider

    def __rich_console__(self, console, options):
        half = max(8, (options.max_width - 3) // 2)
        out = Text(no_wrap=True, overflow="crop")
        rows = [[head.copy() for head in self.heads], [Text("─" * half, style=self.divider)] * 2]
        wrapped = [body.wrap(console, half) for body in self.bodies]
        rows += [[lines[i] if i < len(lines) else Text() for lines in wrapped]
                 for i in range(max(len(lines) for lines in wrapped))]
        for n, (left, right) in enumerate(rows):
            left.truncate(half, pad=True)
            out.append_text(left)
            out.append(" ┼ " if n == 1 else " │ ", style=self.divider)
            out.append_text(right)
            if n < len(rows) - 1:
                out.append("\n")
        yield out
