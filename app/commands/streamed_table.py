"""A table printed window by window as its rows are read, so that a list of 50,000 runs
starts printing at once and costs a few microseconds a row (a rich `Table` measures and
renders every cell of every row before it prints its first line).

Column widths are fitted to the first window: `squeeze` columns are cut (with an
ellipsis) to fit the terminal, the others keep their full width. A later window whose
cells are wider widens those columns from there on, under a header drawn again; a
squeezed column stays cut. Cells are one line each, their control characters already made
visible by the caller; each is printed as `Text`, never as markup.
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.text import Span, Text


def fit(cell: str, width: int, right: bool = False) -> str:
    """`cell` in exactly `width` terminal cells: cut with an ellipsis, or padded."""
    size = cell_len(cell)
    if size > width:
        return set_cell_size(cell, width - 1) + "…" if width > 1 else set_cell_size(cell, width)
    return " " * (width - size) + cell if right else cell + " " * (width - size)


class StreamedTable:
    """Print with `add(rows, styles)` once per window of rows, then `close()`. The cells of
    the column `styled` take their row's style."""

    def __init__(self, console, heads: tuple[str, ...], *, squeeze: tuple[str, ...] = (), right: tuple[str, ...] = (),
                 styled: str | None = None):
        self.console = console
        self.heads = heads
        self.styled = heads.index(styled) if styled else -1
        self.squeeze = {heads.index(h) for h in squeeze}
        self.right = {heads.index(h) for h in right}
        self.widths: list[int] | None = None
        self.open = False

    def _fitted(self, cells: list[list[str]]) -> list[int]:
        widths = [max([len(h), *(cell_len(c[i]) for c in cells)]) for i, h in enumerate(self.heads)]
        room = self.console.width - 3 * len(self.heads) - 1
        for i in sorted(self.squeeze):
            over = sum(widths) - room
            if over > 0:
                widths[i] = max(min(widths[i], 8), widths[i] - over)
        return widths

    def add(self, cells: list[list[str]], styles: list[str] | None = None) -> None:
        """Print a window of rows (each a list of cells, one per head); `styles`: one per row."""
        if not cells:
            return
        if self.widths is None:
            widths = self._fitted(cells)
        else:
            wider = [max([w, *(cell_len(c[i]) for c in cells)]) for i, w in enumerate(self.widths)]
            widths = [self.widths[i] if i in self.squeeze else w for i, w in enumerate(wider)]
        parts: list[str] = []
        spans: list[Span] = []
        at = 0  # characters in `parts` so far

        def put(text: str, style: str = "") -> None:
            nonlocal at
            if style:
                spans.append(Span(at, at + len(text), style))
            parts.append(text)
            at += len(text)

        if widths != self.widths:
            if self.open:
                put(self._rule("└", "┴", "┘", "─") + "\n")
            self.widths = widths
            put(self._rule("┏", "┳", "┓", "━") + "\n┃")
            for i, head in enumerate(self.heads):
                put(" ")
                put(fit(head, widths[i], i in self.right), "bold")
                put(" ┃")
            put("\n" + self._rule("┡", "╇", "┩", "━") + "\n")
            self.open = True
        styled, right = self.styled, self.right
        for n, row in enumerate(cells):
            if styles and styles[n] and 0 <= styled < len(row):
                put("│ " + " │ ".join(fit(c, widths[i], i in right) for i, c in enumerate(row[:styled])) + " │ "
                    if styled else "│ ")
                put(fit(row[styled], widths[styled], styled in right), styles[n])
                put(" │ " + " │ ".join(fit(c, widths[i], i in right) for i, c in enumerate(row) if i > styled) + " │\n")
            else:
                put("│ " + " │ ".join(fit(c, widths[i], i in right) for i, c in enumerate(row)) + " │\n")
        # One Text a window, its styles as spans: appending each cell would cost more than the rest.
        self.console.print(Text("".join(parts), spans=spans, end=""), soft_wrap=True, end="")

    def close(self) -> None:
        if self.open:
            self.console.print(Text(self._rule("└", "┴", "┘", "─")), soft_wrap=True)
            self.open = False

    def _rule(self, left: str, middle: str, end: str, line: str) -> str:
        return left + middle.join(line * (w + 2) for w in self.widths) + end
